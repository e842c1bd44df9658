// The Communicator funnel (argument checks, sequence numbers) and the
// world-size-1 implementation.
#include "zerorun/comm.h"

#include <cstring>

#include "zerorun/cuda_rt.h"
#include "zerorun/error.h"

namespace zerorun {

void Communicator::check(const char* op, int64_t count, const void* a, const void* b) {
  ++seq_;
  ZR_CHECK(count >= 0, op, " #", seq_, ": negative element count ", count);
  ZR_CHECK(count == 0 || (a && b), op, " #", seq_, ": null buffer");
}

void Communicator::enable_watchdog(double timeout_s, std::function<void()> on_timeout) {
  watchdog_ = timeout_s > 0 ? std::make_unique<Watchdog>(timeout_s, rank(), std::move(on_timeout)) : nullptr;
}

void Communicator::all_reduce(void* buf, int64_t count, DType dt, ReduceOp op) {
  check("all_reduce", count, buf, buf);
  WatchGuard g(watchdog_.get(), "all_reduce", seq_, count, dt);
  if (count) do_all_reduce(buf, count, dt, op);
}
void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dt) {
  check("reduce_scatter", count, send, recv);
  WatchGuard g(watchdog_.get(), "reduce_scatter", seq_, count, dt);
  if (count) do_reduce_scatter(send, recv, count, dt);
}
void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dt) {
  check("all_gather", count, send, recv);
  WatchGuard g(watchdog_.get(), "all_gather", seq_, count, dt);
  if (count) do_all_gather(send, recv, count, dt);
}
void Communicator::broadcast(void* buf, int64_t count, DType dt, int root) {
  check("broadcast", count, buf, buf);
  ZR_CHECK(root >= 0 && root < size(), "broadcast #", seq_, ": root ", root, " outside world of ", size());
  WatchGuard g(watchdog_.get(), "broadcast", seq_, count, dt);
  if (count) do_broadcast(buf, count, dt, root);
}
namespace {
struct DoneHandle : CommHandle {
  void wait() override {}
};
// Arms the watchdog while the caller waits on an async collective.
struct WatchedHandle : CommHandle {
  std::unique_ptr<CommHandle> inner;
  Watchdog* wd;
  std::string op;
  int64_t seq, count;
  DType dt;
  void wait() override {
    WatchGuard g(wd, op.c_str(), seq, count, dt);
    inner->wait();
  }
};
}  // namespace

std::unique_ptr<CommHandle> Communicator::watched(std::unique_ptr<CommHandle> h, const char* op, int64_t count,
                                                  DType dt) {
  if (!watchdog_) return h;
  auto w = std::make_unique<WatchedHandle>();
  w->inner = std::move(h);
  w->wd = watchdog_.get();
  w->op = op;
  w->seq = seq_;
  w->count = count;
  w->dt = dt;
  return w;
}

std::unique_ptr<CommHandle> Communicator::do_all_reduce_async(void* buf, int64_t count, DType dt, ReduceOp op) {
  do_all_reduce(buf, count, dt, op);
  return std::make_unique<DoneHandle>();
}
std::unique_ptr<CommHandle> Communicator::do_all_gather_async(const void* s, void* r, int64_t count, DType dt) {
  do_all_gather(s, r, count, dt);
  return std::make_unique<DoneHandle>();
}
std::unique_ptr<CommHandle> Communicator::do_reduce_scatter_async(const void* s, void* r, int64_t count, DType dt) {
  do_reduce_scatter(s, r, count, dt);
  return std::make_unique<DoneHandle>();
}
std::unique_ptr<CommHandle> Communicator::all_reduce_async(void* buf, int64_t count, DType dt, ReduceOp op) {
  check("all_reduce_async", count, buf, buf);
  if (!count) return std::make_unique<DoneHandle>();
  return watched(do_all_reduce_async(buf, count, dt, op), "all_reduce_async", count, dt);
}
std::unique_ptr<CommHandle> Communicator::all_gather_async(const void* send, void* recv, int64_t count, DType dt) {
  check("all_gather_async", count, send, recv);
  if (!count) return std::make_unique<DoneHandle>();
  return watched(do_all_gather_async(send, recv, count, dt), "all_gather_async", count, dt);
}
std::unique_ptr<CommHandle> Communicator::reduce_scatter_async(const void* send, void* recv, int64_t count, DType dt) {
  check("reduce_scatter_async", count, send, recv);
  if (!count) return std::make_unique<DoneHandle>();
  return watched(do_reduce_scatter_async(send, recv, count, dt), "reduce_scatter_async", count, dt);
}

void Communicator::barrier() {
  ++seq_;
  WatchGuard g(watchdog_.get(), "barrier", seq_, 0, DType::F32);
  do_barrier();
}

namespace {
class SelfComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }

 protected:
  void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void do_reduce_scatter(const void* s, void* r, int64_t n, DType dt) override { move(r, s, n, dt); }
  void do_all_gather(const void* s, void* r, int64_t n, DType dt) override { move(r, s, n, dt); }
  // Buffers may be device memory (a one-GPU run): copy through CUDA then.
  static void move(void* r, const void* s, int64_t n, DType dt) {
    if (s == r) return;
    size_t b = static_cast<size_t>(n) * dtype_size(dt);
    if (cuda::available())
      cuda::copy(r, s, b);
    else
      std::memmove(r, s, b);
  }
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_barrier() override {}
};
}  // namespace

std::unique_ptr<Communicator> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace zerorun
