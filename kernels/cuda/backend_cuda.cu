// The CUDA backend: every op's forward and backward, optimizer updates and
// reductions on the GPU (cuBLAS for products, hand-written kernels for the
// rest), on the one stream of cuda::stream(). Checked against the CPU backend op by op
// (tests/unit/test_cuda_ops.cc, run on the device machine). This file makes the backend; its class and shared
// helpers are in backend_cuda.h, each op family's kernels and methods in a file of its own.
#include "backend_cuda.h"
#include "zerorun/knobs.h"

namespace zerorun::kernels {
namespace {

__global__ void k_set1(float* p, float v) { *p = v; }

}  // namespace

CudaBackend::CudaBackend() {
  ZR_CUBLAS(cublasCreate(&h_));
  ZR_CUBLAS(cublasSetStream(h_, cuda::stream()));
  attn_atomics_ = knobs().attn_atomics;
  attn_gqa_split_ = knobs().attn_gqa_split;
  deterministic_ = knobs().deterministic;
}

void CudaBackend::rope_fwd(Src qkv, Dst out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
                           const cpu::RopeFreqs& f, bool repeat, const int32_t* pos, int64_t n_pos) {
  rope::forward({qkv.p, qkv.h}, {out.p, out.h}, mm_ == DType::BF16, B, T, H, K, D, f, repeat, pos, n_pos,
                cuda::stream());
}

void CudaBackend::rope_bwd(Src dout, Grad dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
                           const cpu::RopeFreqs& f, bool repeat, const int32_t* pos, int64_t n_pos) {
  if (dqkv)
    rope::backward({dout.p, dout.h}, {dqkv.p, dqkv.h}, dqkv.acc, mm_ == DType::BF16, B, T, H, K, D, f, repeat, pos,
                   n_pos, cuda::stream());
}

void CudaBackend::set_scalar(float* p, float v) {  // a kernel argument: queued, no wait
  k_set1<<<1, 1, 0, cuda::stream()>>>(p, v);
  ZR_CUDA(cudaGetLastError());
}

float CudaBackend::get_scalar(const float* p) {
  float v = 0.f;
  if (ids_flag_)  // the deferred checks' flag comes back with the value, in the same wait
    ZR_CUDA(cudaMemcpyAsync(ids_flag_host_, ids_flag_, sizeof(int), cudaMemcpyDeviceToHost, cuda::stream()));
  cuda::fetch(&v, p, 4);
  raise_deferred(false);
  return v;
}

// At least n zeroed completion counters for the one-kernel column sums (each kernel re-zeroes those it used).
unsigned* CudaBackend::done_counters(int64_t n) {
  if (done_.bytes < static_cast<size_t>(n) * sizeof(unsigned))
    done_ = DevBuf<unsigned>(static_cast<size_t>(std::max<int64_t>(n, 1024)));  // zeroed
  return done_.p;
}

Backend* cuda_backend() {
  static CudaBackend* b = cuda::available() ? new CudaBackend() : nullptr;
  return b;
}

}  // namespace zerorun::kernels
