// NCCL communicator for device buffers, bootstrapped over MPI (rank 0's
// ncclUniqueId is broadcast through the MPI communicator). Collectives run on
// the communicator's own stream; ordering against compute is written out:
// an event recorded on the compute (default) stream is waited on by the NCCL
// stream before each collective, and the call waits for the NCCL stream before
// returning (async forms return a handle that does). Host buffers (loss,
// overflow flags, checkpoint checksums) go through the MPI communicator, so one
// Communicator serves the engine. libnccl.so.2 is loaded at run time with
// the platform layer's load_library (its C ABI is stable), so building needs no NCCL headers and a
// missing library is a clear error, not a link failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "zerorun/comm.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"

namespace zerorun {
namespace {

// The parts of nccl.h we use (ABI of NCCL 2.x).
using ncclComm_t = struct ncclComm*;
struct ncclUniqueId {
  char internal[128];
};
enum { kNcclInt32 = 2, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9 };
enum { kNcclSum = 0, kNcclMax = 2 };

struct Nccl {
  void* lib = nullptr;
  int (*GetVersion)(int*);
  int (*GetUniqueId)(ncclUniqueId*);
  int (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  int (*CommDestroy)(ncclComm_t);
  int (*CommAbort)(ncclComm_t);
  const char* (*GetErrorString)(int);
  int (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  int (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  int (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
  int (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
};

const Nccl& nccl() {
  static Nccl n = [] {
    Nccl r{};
    const char* names[] = {knobs().nccl_lib.empty() ? nullptr : knobs().nccl_lib.c_str(), "libnccl.so.2", "libnccl.so"};
    std::string err;
    for (const char* nm : names)
      if (nm && (r.lib = platform::load_library(nm, &err, true))) break;
    ZR_CHECK(r.lib, "cannot load NCCL (libnccl.so.2): ", err,
             " -- install NCCL or point ZERORUN_NCCL_LIB / LD_LIBRARY_PATH at it");
    auto sym = [&](const char* s) {
      void* p = platform::library_symbol(r.lib, s);
      ZR_CHECK(p, "NCCL library lacks ", s);
      return p;
    };
    r.GetVersion = reinterpret_cast<decltype(r.GetVersion)>(sym("ncclGetVersion"));
    r.GetUniqueId = reinterpret_cast<decltype(r.GetUniqueId)>(sym("ncclGetUniqueId"));
    r.CommInitRank = reinterpret_cast<decltype(r.CommInitRank)>(sym("ncclCommInitRank"));
    r.CommDestroy = reinterpret_cast<decltype(r.CommDestroy)>(sym("ncclCommDestroy"));
    r.CommAbort = reinterpret_cast<decltype(r.CommAbort)>(sym("ncclCommAbort"));
    r.GetErrorString = reinterpret_cast<decltype(r.GetErrorString)>(sym("ncclGetErrorString"));
    r.AllReduce = reinterpret_cast<decltype(r.AllReduce)>(sym("ncclAllReduce"));
    r.ReduceScatter = reinterpret_cast<decltype(r.ReduceScatter)>(sym("ncclReduceScatter"));
    r.AllGather = reinterpret_cast<decltype(r.AllGather)>(sym("ncclAllGather"));
    r.Broadcast = reinterpret_cast<decltype(r.Broadcast)>(sym("ncclBroadcast"));
    return r;
  }();
  return n;
}

void nccl_check(int rc, const char* what) {
  if (rc != 0) ZR_FAIL("NCCL ", what, " failed: ", nccl().GetErrorString(rc));
}

int nccl_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return kNcclFloat32;
    case DType::BF16:
      return kNcclBfloat16;
    case DType::F16:
      return kNcclFloat16;
    case DType::I32:
      return kNcclInt32;
    default:
      ZR_FAIL("NCCL: unsupported dtype ", dtype_name(dt));
  }
}

// NCCL refuses two ranks of one communicator on the same GPU with a bare "invalid usage"; name them instead.
void check_one_gpu_per_rank(Communicator& host) {
  const int W = host.size();
  if (W < 2) return;
  char me[128] = {};
  const std::string hn = platform::host_name().substr(0, 63);
  const int dev = cuda::current_device();
  std::snprintf(me, sizeof me, "%s %s", hn.c_str(), cuda::pci_bus_id(dev).c_str());
  std::vector<char> all(sizeof me * static_cast<size_t>(W));
  host.all_gather(me, all.data(), sizeof me / 2, DType::U16);
  for (int i = 0; i < W; ++i)
    for (int j = i + 1; j < W; ++j)
      if (std::strncmp(&all[sizeof me * i], &all[sizeof me * j], sizeof me) == 0)
        ZR_FAIL("ranks ", i, " and ", j, " both use GPU ", &all[sizeof me * i], " (CUDA device ", dev,
                " here): NCCL needs one GPU per rank. Start at most as many ranks per node as GPUs visible "
                "(--num_gpus, CUDA_VISIBLE_DEVICES), or pass --comm mpi to share GPUs through host memory");
}

class NcclHandle : public CommHandle {
 public:
  cudaEvent_t done = nullptr;
  ~NcclHandle() override {
    if (done) {
      cudaEventSynchronize(done);
      cudaEventDestroy(done);
    }
  }
  void wait() override {
    if (done) {
      ZR_CUDA(cudaEventSynchronize(done));
      cudaEventDestroy(done);
      done = nullptr;
    }
  }
};

class NcclComm : public Communicator {
 public:
  explicit NcclComm(std::unique_ptr<Communicator> host) : host_(std::move(host)) {
    check_one_gpu_per_rank(*host_);
    // NVLink multicast (NVLS) stays off unless the user asks for it: on shared hosts a program using it can put
    // the GPUs out of service. NCCL reads this at init; a value already set (e.g. NCCL_NVLS_ENABLE=1) is kept.
    if (!std::getenv("NCCL_NVLS_ENABLE")) platform::set_env("NCCL_NVLS_ENABLE", "0");
    ncclUniqueId id{};
    if (host_->rank() == 0) nccl_check(nccl().GetUniqueId(&id), "GetUniqueId");
    host_->broadcast(&id, sizeof id / 2, DType::U16, 0);  // 128 bytes as 64 u16 words
    // As high as the compute stream: a collective is not held back behind compute kernels' blocks.
    ZR_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, cuda::stream_priority(true)));
    ZR_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    nccl_check(nccl().CommInitRank(&comm_, host_->size(), id, host_->rank()), "CommInitRank");
    double timeout = 1800;
    if (knobs().has_comm_timeout) timeout = std::atof(knobs().comm_timeout.c_str());
    if (size() > 1)
      enable_watchdog(timeout, [this] {
        nccl().CommAbort(comm_);
        mpi_abort_job(1);
      });
  }
  ~NcclComm() override {
    enable_watchdog(0, nullptr);
    if (comm_) nccl().CommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override {
    int v = 0;
    nccl().GetVersion(&v);
    return "nccl " + std::to_string(v);
  }

 protected:
  // Compute stream -> NCCL stream ordering.
  void order_after_compute() {
    ZR_CUDA(cudaEventRecord(ready_, cuda::stream()));
    ZR_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  void finish() { ZR_CUDA(cudaStreamSynchronize(stream_)); }
  std::unique_ptr<CommHandle> finish_async() {
    auto h = std::make_unique<NcclHandle>();
    ZR_CUDA(cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming));
    ZR_CUDA(cudaEventRecord(h->done, stream_));
    return h;
  }
  void do_all_reduce(void* buf, int64_t n, DType dt, ReduceOp op) override {
    if (!cuda::is_device_pointer(buf)) return host_->all_reduce(buf, n, dt, op);
    order_after_compute();
    nccl_check(nccl().AllReduce(buf, buf, static_cast<size_t>(n), nccl_type(dt),
                                op == ReduceOp::Max ? kNcclMax : kNcclSum, comm_, stream_),
               "all_reduce");
    finish();
  }
  void do_reduce_scatter(const void* s, void* r, int64_t n, DType dt) override {
    if (!cuda::is_device_pointer(s)) return host_->reduce_scatter(s, r, n, dt);
    order_after_compute();
    nccl_check(nccl().ReduceScatter(s, r, static_cast<size_t>(n), nccl_type(dt), kNcclSum, comm_, stream_),
               "reduce_scatter");
    finish();
  }
  void do_all_gather(const void* s, void* r, int64_t n, DType dt) override {
    if (!cuda::is_device_pointer(r)) return host_->all_gather(s, r, n, dt);
    order_after_compute();
    nccl_check(nccl().AllGather(s, r, static_cast<size_t>(n), nccl_type(dt), comm_, stream_), "all_gather");
    finish();
  }
  void do_broadcast(void* buf, int64_t n, DType dt, int root) override {
    if (!cuda::is_device_pointer(buf)) return host_->broadcast(buf, n, dt, root);
    order_after_compute();
    nccl_check(nccl().Broadcast(buf, buf, static_cast<size_t>(n), nccl_type(dt), root, comm_, stream_), "broadcast");
    finish();
  }
  void do_barrier() override { host_->barrier(); }
  std::unique_ptr<CommHandle> do_all_gather_async(const void* s, void* r, int64_t n, DType dt) override {
    if (!cuda::is_device_pointer(r)) return host_->all_gather_async(s, r, n, dt);
    order_after_compute();
    nccl_check(nccl().AllGather(s, r, static_cast<size_t>(n), nccl_type(dt), comm_, stream_), "all_gather_async");
    return finish_async();
  }
  std::unique_ptr<CommHandle> do_reduce_scatter_async(const void* s, void* r, int64_t n, DType dt) override {
    if (!cuda::is_device_pointer(s)) return host_->reduce_scatter_async(s, r, n, dt);
    order_after_compute();
    nccl_check(nccl().ReduceScatter(s, r, static_cast<size_t>(n), nccl_type(dt), kNcclSum, comm_, stream_),
               "reduce_scatter_async");
    return finish_async();
  }
  std::unique_ptr<CommHandle> do_all_reduce_async(void* buf, int64_t n, DType dt, ReduceOp op) override {
    if (!cuda::is_device_pointer(buf)) return host_->all_reduce_async(buf, n, dt, op);
    order_after_compute();
    nccl_check(nccl().AllReduce(buf, buf, static_cast<size_t>(n), nccl_type(dt),
                                op == ReduceOp::Max ? kNcclMax : kNcclSum, comm_, stream_),
               "all_reduce_async");
    return finish_async();
  }

 private:
  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

}  // namespace

std::string nccl_report() {
  try {
    const Nccl& n = nccl();
    int v = 0;
    n.GetVersion(&v);  // major * 10000 + minor * 100 + patch since 2.9
    std::string where = "?";
    const std::string file = platform::library_path_of(reinterpret_cast<void*>(n.GetVersion));
    if (!file.empty()) where = file;
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) + " (" +
           where + ")";
  } catch (const Error& e) {
    return std::string("not loadable -- GPU runs with several ranks need it (or --comm mpi): ") + e.what();
  }
}

std::unique_ptr<Communicator> make_nccl_comm(std::unique_ptr<Communicator> host) {
  return std::make_unique<NcclComm>(std::move(host));
}

}  // namespace zerorun
