// Watchdog check (run by tests/watchdog_test.sh under mpirun -np 2): rank 1
// never joins the barrier, so rank 0's watchdog must end the job naming the op.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "zerorun/comm.h"
#include "zerorun/platform.h"

int main() {
  zerorun::platform::set_env("ZERORUN_COMM_TIMEOUT", "2");
  auto comm = zerorun::make_mpi_comm();
  float x = 1.f;
  comm->all_reduce(&x, 1, zerorun::DType::F32, zerorun::ReduceOp::Sum);          // both ranks: completes
  if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));  // stuck rank
  comm->barrier();
  std::printf("rank %d: barrier returned (the watchdog did not fire)\n", comm->rank());
  return 0;
}
