// A build without CUDA has no NCCL communicator: this file stands in for src/comm/nccl_comm.cu (CMake links one
// of the two), so callers need no #ifdef.
#include "zerorun/comm.h"
#include "zerorun/error.h"

namespace zerorun {

std::string nccl_report() { return "not used (CPU-only build)"; }

std::unique_ptr<Communicator> make_nccl_comm(std::unique_ptr<Communicator>) {
  ZR_FAIL("the NCCL communicator needs a CUDA build of zerorun");
}

}  // namespace zerorun
