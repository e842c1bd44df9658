// NCCL communicator on device buffers (any world size under mpirun; on the
// one-GPU machine it runs as a single rank, which still exercises bootstrap,
// stream ordering and the host/device routing). Exit 77 without a GPU.
// `--stall` (tests/run_multi_gpu.sh, 2+ GPUs): rank 1 stops before a device all_reduce, so rank 0's watchdog
// (ZERORUN_COMM_TIMEOUT=3) must abort NCCL and end the job, naming the op and its sequence number.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "zerorun/comm.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"
#include "zerorun/tensor.h"
#include "zerorun/trainer.h"

using namespace zerorun;

int main(int argc, char** argv) {
  if (!cuda::available()) {
    std::printf("no GPU visible: NCCL test skipped\n");
    return 77;
  }
  const bool stall = argc > 1 && std::strcmp(argv[1], "--stall") == 0;
  if (stall) platform::set_env("ZERORUN_COMM_TIMEOUT", "3"), reload_knobs();
  int passed = 0, failed = 0;
  auto expect = [&](bool ok, const char* what) {
    ok ? ++passed : ++failed;
    if (!ok) std::fprintf(stderr, "FAIL %s\n", what);
  };
  try {
    cuda::set_device(local_rank() % cuda::device_count());
    auto comm = make_nccl_comm(make_mpi_comm());
    const int R = comm->rank(), W = comm->size();
    const Device gpu = Device::cuda(local_rank() % cuda::device_count());
    if (stall) {
      Tensor d = Tensor::zeros({1024}, DType::F32, MemCategory::Buffers, gpu);
      comm->all_reduce(d.f32(), 1024, DType::F32, ReduceOp::Sum);  // both ranks: completes
      (void)d.to(Device::cpu());
      if (R == 1) std::this_thread::sleep_for(std::chrono::seconds(60));  // the stuck rank
      comm->all_reduce(d.f32(), 1024, DType::F32, ReduceOp::Sum);
      (void)d.to(Device::cpu());
      std::printf("rank %d: the all_reduce returned (the watchdog did not fire)\n", R);
      return W > 1 ? 1 : 0;
    }
    for (int64_t n : {1, 1000, 4099}) {
      Tensor h = Tensor::empty({n * W}, DType::F32);
      for (int64_t i = 0; i < n * W; ++i) h.f32()[i] = static_cast<float>(R + 1) + 0.5f * (i % 3);
      Tensor d = h.to(gpu);
      comm->all_reduce(d.f32(), n * W, DType::F32, ReduceOp::Sum);
      Tensor back = d.to(Device::cpu());
      bool ok = true;
      for (int64_t i = 0; i < n * W; ++i)
        ok = ok && std::fabs(back.f32()[i] - (W * (W + 1) / 2.0f + W * 0.5f * (i % 3))) < 1e-4;
      expect(ok, "all_reduce f32 on device");
      Tensor rs = Tensor::empty({n}, DType::F32, MemCategory::Buffers, gpu);
      Tensor src = h.to(gpu);
      comm->reduce_scatter(src.f32(), rs.f32(), n, DType::F32);
      Tensor rsh = rs.to(Device::cpu());
      expect(std::fabs(rsh.f32()[0] - (W * (W + 1) / 2.0f + W * 0.5f * ((R * n) % 3))) < 1e-4, "reduce_scatter");
      Tensor mine = Tensor::empty({n}, DType::F32);
      for (int64_t i = 0; i < n; ++i) mine.f32()[i] = static_cast<float>(R);
      Tensor md = mine.to(gpu), all = Tensor::empty({n * W}, DType::F32, MemCategory::Buffers, gpu);
      auto hnd = comm->all_gather_async(md.f32(), all.f32(), n, DType::F32);
      hnd->wait();
      Tensor ah = all.to(Device::cpu());
      ok = true;
      for (int r = 0; r < W; ++r) ok = ok && ah.f32()[r * n] == static_cast<float>(r);
      expect(ok, "all_gather_async on device");
      Tensor bf = Tensor::empty({n}, DType::BF16);
      for (int64_t i = 0; i < n; ++i) bf.data<uint16_t>()[i] = f32_to_bf16(1.5f);
      Tensor bfd = bf.to(gpu);
      comm->all_reduce(bfd.raw(), n, DType::BF16, ReduceOp::Sum);
      expect(bf16_to_f32(bfd.to(Device::cpu()).data<uint16_t>()[n - 1]) == 1.5f * W, "all_reduce bf16 on device");
    }
    float host = 2.f;  // host buffers go through MPI
    comm->all_reduce(&host, 1, DType::F32, ReduceOp::Max);
    expect(host == 2.f, "host buffer routed to MPI");
    comm->barrier();
    std::printf("%s on %d rank(s): %d passed, %d failed\n", comm->name().c_str(), W, passed, failed);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return failed ? 1 : 0;
}
