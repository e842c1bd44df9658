// Communicator: the collectives ZeRO needs on flat buffers. Every call goes
// through one funnel that checks arguments and counts a sequence number.
// `SelfComm` is the world-size-1 implementation (copies, no peers).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "zerorun/dtype.h"

namespace zerorun {

enum class ReduceOp { Sum, Max };

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
  int64_t sequence() const { return seq_; }

 protected:
  virtual void do_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt) = 0;
  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType dt) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dt, int root) = 0;
  virtual void do_barrier() = 0;

 private:
  void check(const char* op, int64_t count, const void* a, const void* b);
  int64_t seq_ = 0;
};

std::unique_ptr<Communicator> make_self_comm();

}  // namespace zerorun
