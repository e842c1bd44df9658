// CUDA runtime slice for the core: the one stream, a caching device allocator
// (blocks are kept per rounded size and reused, like PyTorch's) with a
// private pool for CUDA graphs, copies, device selection and graph capture.
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "cuda_check.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/memory.h"

namespace zerorun::cuda {
namespace {
struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block
  size_t cached = 0;
  // Blocks of the graph pool: handed out only while a graph is captured, since a graph's replays write to the
  // addresses it was captured with; a block freed during a capture joins the pool too.
  bool capturing = false;
  std::unordered_set<void*> graph_owned;
  std::multimap<size_t, void*> graph_free;
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

int current_device() {
  int d = 0;
  ZR_CUDA(cudaGetDevice(&d));
  return d;
}

std::string pci_bus_id(int device) {
  char id[64] = {};
  ZR_CUDA(cudaDeviceGetPCIBusId(id, sizeof id, device));
  return id;
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clears the error an unknown pointer leaves
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

namespace {
thread_local cudaStream_t t_side = nullptr;  // SideStream::Scope's redirect
cudaStream_t main_stream() {
  static cudaStream_t s = [] {
    cudaStream_t t = nullptr;
    // Blocking, on the device current at first use (set_device comes first).
    ZR_CUDA(cudaStreamCreateWithPriority(&t, cudaStreamDefault, stream_priority(true)));
    return t;
  }();
  return s;
}
}  // namespace

int stream_priority(bool top) {
  int least = 0, greatest = 0;
  ZR_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return top ? greatest : least;
}

cudaStream_t stream() { return t_side ? t_side : main_stream(); }

SideStream::SideStream(int events) {
  cudaStream_t s = nullptr;
  ZR_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, stream_priority(false)));
  stream_ = s;
  cudaEvent_t e = nullptr;
  ZR_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  main_done_ = e;
  for (int k = 0; k < events; ++k) {
    ZR_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
}

SideStream::~SideStream() {
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (main_done_) cudaEventDestroy(static_cast<cudaEvent_t>(main_done_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void SideStream::after_main() {
  ZR_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(main_done_), main_stream()));
  ZR_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(main_done_), 0));
}

void SideStream::record(int k) {
  ZR_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(k))),
                          static_cast<cudaStream_t>(stream_)));
}

void SideStream::main_waits(int k) const {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ZR_CUDA(cudaStreamIsCapturing(main_stream(), &st));
  // In a capture the wait becomes an external-event node: each replay waits for the event's latest record.
  ZR_CUDA(cudaStreamWaitEvent(main_stream(), static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(k))),
                              st == cudaStreamCaptureStatusActive ? cudaEventWaitExternal : cudaEventWaitDefault));
}

SideStream::Scope::Scope(SideStream& s) : prev_(t_side) { t_side = static_cast<cudaStream_t>(s.stream_); }
SideStream::Scope::~Scope() { t_side = static_cast<cudaStream_t>(prev_); }

void fetch(void* host, const void* dev, size_t bytes) {
  ZR_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream()));
  ZR_CUDA(cudaStreamSynchronize(stream()));
}

void* device_alloc(size_t bytes, int device, const char* what) {
  size_t r = round_size(bytes ? bytes : 1);
  Cache& c = cache();
  bool capturing = false;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    capturing = c.capturing;
    auto& pool = capturing ? c.graph_free : c.free_blocks;
    auto it = pool.find(r);
    if (it != pool.end()) {
      void* p = it->second;
      pool.erase(it);
      c.cached -= r;
      return p;
    }
  }
  ZR_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, r);
  if (e == cudaSuccess && capturing) {
    std::lock_guard<std::mutex> lk(c.mu);
    c.graph_owned.insert(p);
  }
  if (e == cudaErrorMemoryAllocation && !capturing) {  // give cached blocks back and retry once (no frees in a capture)
    cudaGetLastError();
    std::lock_guard<std::mutex> lk(c.mu);
    for (auto& [s, b] : c.free_blocks) cudaFree(b), c.cached -= s;
    c.free_blocks.clear();
    e = cudaMalloc(&p, r);
  }
  if (e != cudaSuccess && e != cudaErrorMemoryAllocation)
    ZR_FAIL("cudaMalloc of ", bytes, " bytes (", what, ") on cuda:", device, " failed: ", cudaGetErrorString(e));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    const MemStats m = mem_stats(true);
    std::string held;
    for (size_t k = 0; k < m.current.size(); ++k)
      held += std::string(k ? ", " : "") + mem_category_name(static_cast<MemCategory>(k)) + " " +
              std::to_string(m.current[k] >> 20);
    ZR_FAIL("out of GPU memory on cuda:", device, " allocating ", bytes >> 20, " MiB (", bytes, " bytes) for ", what,
            ": ", fr >> 20, " MiB free of ", tot >> 20, " MiB; this rank holds (MiB) ", held,
            capturing ? "" : ", and no cached blocks (given back)",
            ". To fit: a smaller train_micro_batch_size_per_gpu (with more gradient_accumulation_steps), "
            "activation_checkpointing, a higher zero_optimization.stage, offload_optimizer to cpu, or more ranks; "
            "`zerorun estimate` prints the model states a rank needs");
  }
  return p;
}

bool host_register(void* p, size_t bytes, std::string* why) {
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  if (why) *why = cudaGetErrorString(e);
  return false;
}

void host_unregister(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

void device_free(void* p, size_t bytes, int /*device*/) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  size_t r = round_size(bytes ? bytes : 1);
  if (c.capturing) c.graph_owned.insert(p);  // the graph being captured may still use it: kept for graphs
  (c.graph_owned.count(p) ? c.graph_free : c.free_blocks).emplace(r, p);
  c.cached += r;
}

void device_memset0(void* p, size_t bytes) {
  if (bytes) ZR_CUDA(cudaMemsetAsync(p, 0, bytes, stream()));
}

void device_fill_ff(void* p, size_t bytes) {
  if (bytes) ZR_CUDA(cudaMemsetAsync(p, 0xFF, bytes, stream()));
}

void copy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  ZR_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  ZR_CUDA(cudaStreamSynchronize(stream()));
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
  ZR_CUDA(cudaMemcpyAsync(dst, s.p, bytes, cudaMemcpyHostToDevice, stream()));
  ZR_CUDA(cudaEventRecord(s.done, stream()));
}

void synchronize() { ZR_CUDA(cudaDeviceSynchronize()); }

size_t cached_bytes() {
  std::lock_guard<std::mutex> lk(cache().mu);
  return cache().cached;
}

Graph::~Graph() { reset(); }

void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

void Graph::begin_capture() {
  reset();
  Cache& c = cache();
  {
    // Cached blocks go back to CUDA first: the capture's allocations come from fresh blocks of the graph pool.
    ZR_CUDA(cudaStreamSynchronize(stream()));
    std::lock_guard<std::mutex> lk(c.mu);
    ZR_CHECK(!c.capturing, "a CUDA graph is already being captured");
    for (auto& [sz, b] : c.free_blocks) {
      ZR_CUDA(cudaFree(b));
      c.cached -= sz;
    }
    c.free_blocks.clear();
    c.capturing = true;
  }
  cudaError_t e = cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> lk(c.mu);
    c.capturing = false;
  }
  ZR_CUDA(e);
}

void Graph::end_capture() {
  Cache& c = cache();
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream(), &g);
  {
    std::lock_guard<std::mutex> lk(c.mu);
    c.capturing = false;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    ZR_FAIL("capturing the step's CUDA graph failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
            "); ZERORUN_CUDA_GRAPHS=0 runs without graphs");
  }
  graph_ = g;
  cudaGraphExec_t x = nullptr;
  ZR_CUDA(cudaGraphInstantiate(&x, g, 0));
  exec_ = x;
}

void Graph::abort_capture() {
  Cache& c = cache();
  cudaGraph_t g = nullptr;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &st) == cudaSuccess && st != cudaStreamCaptureStatusNone &&
      cudaStreamEndCapture(stream(), &g) == cudaSuccess && g)
    cudaGraphDestroy(g);
  cudaGetLastError();
  std::lock_guard<std::mutex> lk(c.mu);
  c.capturing = false;
}

void Graph::launch() {
  ZR_CHECK(exec_, "CUDA graph launched before it was captured");
  ZR_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()));
}

}  // namespace zerorun::cuda
