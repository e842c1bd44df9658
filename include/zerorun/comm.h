// Communicator: the collectives ZeRO needs on flat buffers. Every call goes
// through one funnel that checks arguments and counts a sequence number.
// `SelfComm` is the world-size-1 implementation (copies, no peers).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "zerorun/dtype.h"
#include "zerorun/watchdog.h"

namespace zerorun {

enum class ReduceOp { Sum, Max };

// Completion handle of an asynchronous collective; wait() is idempotent and
// the destructor waits, so buffers are never released under a running op.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // In place; `count` elements of `dt`.
  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op);
  // send holds size()*count elements; recv gets this rank's reduced `count`.
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt);
  // send holds `count`; recv gets size()*count (rank order).
  void all_gather(const void* send, void* recv, int64_t count, DType dt);
  void broadcast(void* buf, int64_t count, DType dt, int root);
  void barrier();
  // Asynchronous forms: the buffers must stay alive until wait().
  std::unique_ptr<CommHandle> all_reduce_async(void* buf, int64_t count, DType dt, ReduceOp op);
  std::unique_ptr<CommHandle> all_gather_async(const void* send, void* recv, int64_t count, DType dt);
  std::unique_ptr<CommHandle> reduce_scatter_async(const void* send, void* recv, int64_t count, DType dt);
  int64_t sequence() const { return seq_; }
  // Every later collective (and async wait) is watched: past `timeout_s`
  // the job is ended by `on_timeout` with a message naming the op.
  void enable_watchdog(double timeout_s, std::function<void()> on_timeout);

 protected:
  virtual void do_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt) = 0;
  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType dt) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dt, int root) = 0;
  virtual void do_barrier() = 0;
  // Default async = run now, return a completed handle.
  virtual std::unique_ptr<CommHandle> do_all_reduce_async(void* buf, int64_t count, DType dt, ReduceOp op);
  virtual std::unique_ptr<CommHandle> do_all_gather_async(const void* s, void* r, int64_t count, DType dt);
  virtual std::unique_ptr<CommHandle> do_reduce_scatter_async(const void* s, void* r, int64_t count, DType dt);

 private:
  void check(const char* op, int64_t count, const void* a, const void* b);
  std::unique_ptr<CommHandle> watched(std::unique_ptr<CommHandle> h, const char* op, int64_t count, DType dt);
  int64_t seq_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
};

std::unique_ptr<Communicator> make_self_comm();
// MPI over host buffers (initialises MPI if needed; finalises at exit).
std::unique_ptr<Communicator> make_mpi_comm();
// NCCL for device buffers (bootstrapped over `host`, which keeps serving host
// buffers). Throws when CUDA is not built or libnccl.so.2 cannot be loaded.
std::unique_ptr<Communicator> make_nccl_comm(std::unique_ptr<Communicator> host);
// The NCCL this process would load (version and library), or why it cannot (for `zerorun report`).
std::string nccl_report();
// Device buffers through `host` (MPI) via host memory: no NCCL needed, and ranks may share a GPU (--comm mpi).
std::unique_ptr<Communicator> make_staged_comm(std::unique_ptr<Communicator> host);
// True when this process was started by mpirun/srun with more than one rank.
bool launched_by_mpi();
// This rank's index among the ranks on its node, from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) when the MPI
// communicator was made (every MPI, every platform: MS-MPI sets no local-rank variable); -1 before that.
int mpi_local_rank();
// Ends every rank of an MPI job (after this rank printed why).
[[noreturn]] void mpi_abort_job(int code);

}  // namespace zerorun
