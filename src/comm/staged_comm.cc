// Device buffers over a host communicator (`--comm mpi` with --device cuda): each collective on GPU memory is
// copied to host memory after the compute stream's queued work, run by the host (MPI) communicator, and copied
// back before the call returns. Slower than NCCL, but it needs no NCCL and lets several ranks share one GPU,
// which NCCL refuses ("invalid usage"): the multi-rank ZeRO paths of the GPU engine can then run on a machine
// with a single GPU. Host buffers go straight to the host communicator. Asynchronous forms complete at once.
// The staging buffers are page-locked (direct DMA copies) where the OS allows.
#include <algorithm>

#include "zerorun/comm.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/tensor.h"

namespace zerorun {
namespace {

class StagedComm : public Communicator {
 public:
  explicit StagedComm(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name() + ", device buffers staged through host memory"; }

 protected:
  // A host view of `bytes` at p: p itself, or scratch buffer `slot` (filled from the device when `in`).
  void* host_view(const void* p, size_t bytes, int slot, bool in) {
    if (!cuda::is_device_pointer(p)) return const_cast<void*>(p);
    Tensor& s = scratch_[slot];
    if (!s.defined() || s.nbytes() < bytes) {  // grown by half again at least; page-locked for direct copies
      const size_t n = std::max(bytes, s.defined() ? s.nbytes() * 3 / 2 : size_t{0});
      s = Tensor::uninit({static_cast<int64_t>((n + 3) / 4)}, DType::I32, MemCategory::Buffers);
      s.pin_memory();  // where it cannot, the copies go through pageable memory (slower, the same bytes)
    }
    if (in) cuda::copy(s.raw(), p, bytes);  // on the compute stream: after the kernels that wrote p
    return s.raw();
  }
  void back(void* dev, const void* view, size_t bytes) {
    if (view != dev) cuda::copy(dev, view, bytes);
  }
  size_t bytes(int64_t n, DType dt) const { return static_cast<size_t>(n) * dtype_size(dt); }

  void do_all_reduce(void* buf, int64_t n, DType dt, ReduceOp op) override {
    void* h = host_view(buf, bytes(n, dt), 0, true);
    host_->all_reduce(h, n, dt, op);
    back(buf, h, bytes(n, dt));
  }
  void do_reduce_scatter(const void* s, void* r, int64_t n, DType dt) override {
    const void* hs = host_view(s, bytes(n * size(), dt), 0, true);
    void* hr = host_view(r, bytes(n, dt), 1, false);
    host_->reduce_scatter(hs, hr, n, dt);
    back(r, hr, bytes(n, dt));
  }
  void do_all_gather(const void* s, void* r, int64_t n, DType dt) override {
    const void* hs = host_view(s, bytes(n, dt), 0, true);
    void* hr = host_view(r, bytes(n * size(), dt), 1, false);
    host_->all_gather(hs, hr, n, dt);
    back(r, hr, bytes(n * size(), dt));
  }
  void do_broadcast(void* buf, int64_t n, DType dt, int root) override {
    void* h = host_view(buf, bytes(n, dt), 0, true);
    host_->broadcast(h, n, dt, root);
    back(buf, h, bytes(n, dt));
  }
  void do_barrier() override { host_->barrier(); }

 private:
  std::unique_ptr<Communicator> host_;
  Tensor scratch_[2];
};

}  // namespace

std::unique_ptr<Communicator> make_staged_comm(std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedComm>(std::move(host));
}

}  // namespace zerorun
