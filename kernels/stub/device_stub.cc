// CPU-only build: no CUDA runtime is linked, so no GPU is visible.
#include "zerorun/build_info.h"

namespace zerorun {
bool built_with_cuda() { return false; }
GpuInfo query_gpus() { return {0, "CUDA support not built (no CUDA toolkit found at configure time)", "none", "", ""}; }
std::string gpu_arch_problem(int) { return ""; }
}  // namespace zerorun

#include "zerorun/cuda_rt.h"
#include "zerorun/error.h"

namespace zerorun::cuda {
namespace {
[[noreturn]] void not_built() { ZR_FAIL("this zerorun was built without CUDA (no toolkit at configure time)"); }
}  // namespace
bool available() { return false; }
int device_count() { return 0; }
void set_device(int) { not_built(); }
int current_device() { not_built(); }
std::string pci_bus_id(int) { not_built(); }
bool is_device_pointer(const void*) { return false; }
void* device_alloc(size_t, int, const char*) { not_built(); }
bool host_register(void*, size_t, std::string* why) {
  if (why) *why = "this zerorun is built without CUDA";
  return false;
}
void host_unregister(void*) {}
void device_free(void*, size_t, int) {}
void device_memset0(void*, size_t) { not_built(); }
void device_fill_ff(void*, size_t) { not_built(); }
void copy(void*, const void*, size_t) { not_built(); }
void upload(void*, const void*, size_t) { not_built(); }
void synchronize() {}
size_t cached_bytes() { return 0; }
Graph::~Graph() = default;
void Graph::begin_capture() { not_built(); }
void Graph::end_capture() { not_built(); }
void Graph::abort_capture() {}
void Graph::launch() { not_built(); }
void Graph::reset() {}
SideStream::SideStream(int) { not_built(); }
SideStream::~SideStream() = default;
void SideStream::after_main() { not_built(); }
void SideStream::record(int) { not_built(); }
void SideStream::main_waits(int) const { not_built(); }
SideStream::Scope::Scope(SideStream&) : prev_(nullptr) { not_built(); }
SideStream::Scope::~Scope() = default;
}  // namespace zerorun::cuda

#include "kernels/backend.h"
namespace zerorun::kernels {
Backend* cuda_backend() { return nullptr; }
}  // namespace zerorun::kernels
