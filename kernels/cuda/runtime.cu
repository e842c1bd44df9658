// CUDA runtime slice for the core: a caching device allocator (blocks are
// kept per rounded size and reused, like PyTorch's), copies and device
// selection.
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_check.h"
#include "zerorun/cuda_rt.h"

namespace zerorun::cuda {
namespace {
struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block
  size_t cached = 0;
};
Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: frees at exit are skipped
  return *c;
}
size_t round_size(size_t b) {
  if (b < (1u << 20)) return (b + 511) / 512 * 512;
  return (b + (2u << 20) - 1) / (2u << 20) * (2u << 20);
}
}  // namespace

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void set_device(int i) { ZR_CUDA(cudaSetDevice(i)); }

void* device_alloc(size_t bytes, int device) {
  size_t r = round_size(bytes ? bytes : 1);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.free_blocks.find(r);
    if (it != c.free_blocks.end()) {
      void* p = it->second;
      c.free_blocks.erase(it);
      c.cached -= r;
      return p;
    }
  }
  ZR_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, r);
  if (e == cudaErrorMemoryAllocation) {  // give cached blocks back and retry once
    cudaGetLastError();
    std::lock_guard<std::mutex> lk(c.mu);
    for (auto& [s, b] : c.free_blocks) cudaFree(b);
    c.free_blocks.clear();
    c.cached = 0;
    e = cudaMalloc(&p, r);
  }
  if (e != cudaSuccess) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    ZR_FAIL("out of GPU memory on cuda:", device, " allocating ", bytes, " bytes (", fr >> 20, " MiB free of ",
            tot >> 20, " MiB)");
  }
  return p;
}

void device_free(void* p, size_t bytes, int /*device*/) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  size_t r = round_size(bytes ? bytes : 1);
  c.free_blocks.emplace(r, p);
  c.cached += r;
}

void device_memset0(void* p, size_t bytes) {
  if (bytes) ZR_CUDA(cudaMemset(p, 0, bytes));
}

void device_fill_ff(void* p, size_t bytes) {
  if (bytes) ZR_CUDA(cudaMemset(p, 0xFF, bytes));
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes) ZR_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

namespace {
// Pinned buffers an upload goes through, reused round-robin once the copy that last used one is done.
struct Staging {
  void* p = nullptr;
  size_t cap = 0;
  cudaEvent_t done{};
};
struct StagingRing {
  std::mutex mu;
  Staging slot[8];
  int next = 0;
};
StagingRing& staging() {
  static StagingRing* r = new StagingRing();  // never destroyed, like the allocator's cache
  return *r;
}
}  // namespace

void upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  StagingRing& r = staging();
  std::lock_guard<std::mutex> lk(r.mu);
  Staging& s = r.slot[r.next];
  r.next = (r.next + 1) % 8;
  if (s.done)
    ZR_CUDA(cudaEventSynchronize(s.done));  // long done in practice: seven uploads ago
  else
    ZR_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  if (s.cap < bytes) {
    if (s.p) ZR_CUDA(cudaFreeHost(s.p));
    s.p = nullptr;
    ZR_CUDA(cudaMallocHost(&s.p, bytes));
    s.cap = bytes;
  }
  std::memcpy(s.p, src, bytes);
  ZR_CUDA(cudaMemcpyAsync(dst, s.p, bytes, cudaMemcpyHostToDevice, 0));
  ZR_CUDA(cudaEventRecord(s.done, 0));
}

void synchronize() { ZR_CUDA(cudaDeviceSynchronize()); }

size_t cached_bytes() {
  std::lock_guard<std::mutex> lk(cache().mu);
  return cache().cached;
}

}  // namespace zerorun::cuda
