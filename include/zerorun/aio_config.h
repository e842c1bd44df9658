// The config's "aio" block (NVMe offload's I/O), a struct of its own so that the config layer (config.h) needs
// nothing of src/zero, whose NVMe states (nvme.h) read it.
#pragma once
#include <cstdint>

namespace zerorun::zero {

// DeepSpeed's "aio" block (defaults of DeepSpeed 0.19.5).
struct AioConfig {
  int64_t block_size = 1048576;  // bytes a request (a chunk's moment is split into requests of this size)
  int queue_depth = 8;           // requests in flight (io_uring entries)
  int thread_count = 1;          // DeepSpeed's intra_op_parallelism: accepted; one ring serves a rank
  bool single_submit = false;    // submit each request alone instead of in batches
  bool overlap_events = true;    // read ahead / write behind while the optimizer computes (false: one at a time)
};

}  // namespace zerorun::zero
