// Normalisation on the GPU: layernorm and rmsnorm forward and backward (the one-pass register kernels where a row
// fits), q/k norm dispatch (kernels in qk_norm.cu). Part of the CUDA backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

// Y: float, or uint16_t for 16-bit storage (bf: bfloat16 bits, else fp16). The layernorm kernels below are
// rmsnorm's too where mean is null: no centring (the mean taken as 0) and no bias.
template <class Y>
__global__ void k_ln_fwd(const float* x, const float* w, const float* b, Y* y, float* mean, float* rstd, int64_t N,
                         int64_t C, float eps, bool bf) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* xr = x + row * C;
  float s = 0.f;
  if (mean)
    for (int64_t c = lane; c < C; c += 32) s += xr[c];
  const float m = mean ? warp_sum(s) / C : 0.f;
  float v = 0.f;
  for (int64_t c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
  float rs = rsqrtf(warp_sum(v) / C + eps);
  for (int64_t c = lane; c < C; c += 32) {
    const float v = (xr[c] - m) * rs * w[c] + (b ? b[c] : 0.f);
    if constexpr (sizeof(Y) == 2)
      y[row * C + c] = to16_bits(bf, v);
    else
      y[row * C + c] = v;
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    rstd[row] = rs;
  }
}
// The same with the row in registers (C % 4 == 0, 16-byte aligned rows, C <= 128 * K4): a warp per row, lane l
// holding columns 4 (l + 32 k) .. +3 from one 16-byte load each, so x is read once and every load of the row is
// in flight together (k_ln_fwd reads the row three times, one 4-byte load after another).
template <class Y, int K4>
__global__ void k_ln_fwd_reg(const float* x, const float* w, const float* b, Y* y, float* mean, float* rstd, int64_t N,
                             int64_t C, float eps, bool bf) {
  const int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float4* xr = reinterpret_cast<const float4*>(x + row * C);
  const int64_t c4 = C / 4;
  float4 v[K4];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K4; ++k) {
    const int64_t j = lane + 32 * k;
    v[k] = j < c4 ? xr[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
  }
  const float m = mean ? warp_sum(s) / C : 0.f;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < K4; ++k)
    if (lane + 32 * k < c4) {
      const float a = v[k].x - m, bb = v[k].y - m, c = v[k].z - m, d = v[k].w - m;
      q += (a * a + bb * bb) + (c * c + d * d);
    }
  const float rs = rsqrtf(warp_sum(q) / C + eps);
#pragma unroll
  for (int k = 0; k < K4; ++k) {
    const int64_t j = lane + 32 * k;
    if (j >= c4) continue;
    const float4 wv = reinterpret_cast<const float4*>(w)[j];
    const float4 bv = b ? reinterpret_cast<const float4*>(b)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    const float o0 = (v[k].x - m) * rs * wv.x + bv.x, o1 = (v[k].y - m) * rs * wv.y + bv.y;
    const float o2 = (v[k].z - m) * rs * wv.z + bv.z, o3 = (v[k].w - m) * rs * wv.w + bv.w;
    if constexpr (sizeof(Y) == 2) {
      reinterpret_cast<uint2*>(y + row * C)[j] = pack4_16(bf, o0, o1, o2, o3);
    } else {
      reinterpret_cast<float4*>(y + row * C)[j] = make_float4(o0, o1, o2, o3);
    }
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    rstd[row] = rs;
  }
}
// D: float, or uint16_t for a 16-bit dy.
template <class D>
__global__ void k_ln_bwd_dx(const float* x, const float* w, const float* mean, const float* rstd, const D* dy,
                            float* dx, bool acc, int64_t N, int64_t C, bool bf) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* xr = x + row * C;
  const D* dr = dy + row * C;
  float mu = mean ? mean[row] : 0.f, rs = rstd[row], s1 = 0.f, s2 = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    float g = ld1(dr, c, bf) * w[c];
    s1 += g;
    s2 += g * (xr[c] - mu) * rs;
  }
  s1 = mean ? warp_sum(s1) / C : 0.f;
  s2 = warp_sum(s2) / C;
  for (int64_t c = lane; c < C; c += 32)
    dx[row * C + c] = (acc ? dx[row * C + c] : 0.f) + (ld1(dr, c, bf) * w[c] - s1 - (xr[c] - mu) * rs * s2) * rs;
}
// Layernorm backward in one pass over x and dy (C <= 32 K): a warp per row with the row in registers, dx
// written (or added), and dw / db summed over the block's rows into k_col_partial-style partials (chunk =
// block) for col_final. 8 warps a block, `rows_per` rows a block.
template <class D, int K>
__global__ void __launch_bounds__(256)
    k_ln_bwd_fused(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, float* dx,
                   bool acc, int64_t N, int64_t C, int64_t rows_per, float* part, bool bf) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per);
  float gw[K], gb[K];
#pragma unroll
  for (int k = 0; k < K; ++k) gw[k] = gb[k] = 0.f;
  for (int64_t row = r0 + warp; row < r1; row += 8) {
    const float* xr = x + row * C;
    const D* dr = dy + row * C;
    const float mu = mean ? mean[row] : 0.f, rs = rstd[row];
    float xh[K], d[K], s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t c = lane + 32 * k;
      xh[k] = c < C ? (xr[c] - mu) * rs : 0.f;
      d[k] = c < C ? ld1(dr, c, bf) : 0.f;
      const float g = c < C ? d[k] * w[c] : 0.f;
      s1 += g;
      s2 += g * xh[k];
    }
    s1 = mean ? warp_sum(s1) / C : 0.f;
    s2 = warp_sum(s2) / C;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t c = lane + 32 * k;
      if (c >= C) continue;
      if (dx) {
        const float v = (d[k] * w[c] - s1 - xh[k] * s2) * rs;
        dx[row * C + c] = acc ? dx[row * C + c] + v : v;
      }
      gw[k] += d[k] * xh[k];
      gb[k] += d[k];
    }
  }
  __shared__ float sh[8][32 * K];
  for (int pass = 0; pass < 2; ++pass) {  // dw, then db: add the 8 warps' sums in warp order
#pragma unroll
    for (int k = 0; k < K; ++k) sh[warp][lane + 32 * k] = pass == 0 ? gw[k] : gb[k];
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += 256) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < 8; ++q) v += sh[q][c];
      part[(2 * blockIdx.x + pass) * C + c] = v;
    }
    __syncthreads();
  }
}
// The one-pass layernorm backward with 16-byte accesses (C % 4 == 0, aligned, C <= 128 * K4): a warp per row, lane l
// owning columns 4 (l + 32 k) .. +3. A row's x, dy and (acc) the dx being added to are loaded into registers all
// together, once, and each warp keeps its dw / db sums in shared memory (dynamic: C/4 float4 of w, then per warp
// C/4 float4 of dw and of db, 68 B a column) rather than in registers, which left too few registers for every load
// of a row to be in flight (2.2-2.6 -> 2.5-2.7 TB/s on the H200, bench/ln_probe.cc). The block's 8 warps' sums are
// added in warp order into k_col_partial-style partials (chunk = block) for col_final.
template <class D, int K4>
__global__ void __launch_bounds__(256, K4 <= 8 ? 2 : 1)
    k_ln_bwd_sm(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, float* dx, bool acc,
                int64_t N, int64_t C, int64_t rows_per, float* part, bool bf) {
  extern __shared__ float4 ln_sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per), c4 = C / 4;
  float4* sw = ln_sm;
  float4* sg = ln_sm + c4 * (1 + 2 * warp);
  float4* sb = sg + c4;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t j = threadIdx.x; j < c4; j += 256) sw[j] = reinterpret_cast<const float4*>(w)[j];
  for (int64_t j = lane; j < c4; j += 32) sg[j] = zero, sb[j] = zero;
  __syncthreads();
  for (int64_t row = r0 + warp; row < r1; row += 8) {
    const float4* xr = reinterpret_cast<const float4*>(x + row * C);
    const D* dr = dy + row * C;
    float4* dxr = dx ? reinterpret_cast<float4*>(dx + row * C) : nullptr;
    float4 xv[K4], dv[K4], ov[K4];
#pragma unroll
    for (int k = 0; k < K4; ++k) {
      const int64_t j = lane + 32 * k;
      if (j >= c4) continue;
      xv[k] = xr[j];
      dv[k] = ldv4(dr, j, bf);
      ov[k] = dxr && acc ? dxr[j] : zero;
    }
    const float mu = mean ? mean[row] : 0.f, rs = rstd[row];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < K4; ++k) {
      const int64_t j = lane + 32 * k;
      if (j >= c4) continue;
      float4 h = xv[k];
      h.x = (h.x - mu) * rs, h.y = (h.y - mu) * rs, h.z = (h.z - mu) * rs, h.w = (h.w - mu) * rs;
      xv[k] = h;  // x-hat from here on
      const float4 wv = sw[j], d = dv[k];
      const float g0 = d.x * wv.x, g1 = d.y * wv.y, g2 = d.z * wv.z, g3 = d.w * wv.w;
      s1 += (g0 + g1) + (g2 + g3);
      s2 += (g0 * h.x + g1 * h.y) + (g2 * h.z + g3 * h.w);
      float4 a = sg[j], b = sb[j];
      a.x += d.x * h.x, a.y += d.y * h.y, a.z += d.z * h.z, a.w += d.w * h.w;
      b.x += d.x, b.y += d.y, b.z += d.z, b.w += d.w;
      sg[j] = a, sb[j] = b;
    }
    s1 = mean ? warp_sum(s1) / C : 0.f;
    s2 = warp_sum(s2) / C;
    if (!dxr) continue;
#pragma unroll
    for (int k = 0; k < K4; ++k) {
      const int64_t j = lane + 32 * k;
      if (j >= c4) continue;
      const float4 h = xv[k], d = dv[k], wv = sw[j];
      float4 o = ov[k];
      o.x += (d.x * wv.x - s1 - h.x * s2) * rs;
      o.y += (d.y * wv.y - s1 - h.y * s2) * rs;
      o.z += (d.z * wv.z - s1 - h.z * s2) * rs;
      o.w += (d.w * wv.w - s1 - h.w * s2) * rs;
      dxr[j] = o;
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < c4; j += 256)
    for (int pass = 0; pass < 2; ++pass) {
      float4 v = ln_sm[c4 + pass * c4 + j];
      for (int q = 1; q < 8; ++q) {
        const float4 o = ln_sm[c4 * (1 + 2 * q + pass) + j];
        v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
      }
      reinterpret_cast<float4*>(part + (2 * blockIdx.x + pass) * C)[j] = v;
    }
}
template <class D>
struct LnWB {  // dw += dy * xhat, db += dy
  const float *x, *mean, *rstd;
  const D* dy;
  bool bf;
  __device__ float2 operator()(int64_t r, int64_t c, int64_t C) const {
    float d = ld1(dy, r * C + c, bf);
    return {d * (x[r * C + c] - (mean ? mean[r] : 0.f)) * rstd[r], d};
  }
};
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }
// f(std::integral_constant<int, K4>) for the smallest instantiated K4 with 128 * K4 >= C (C <= 2048): the float4
// chunks a lane holds in the register-row layernorm kernels.
template <class F>
void with_k4(int64_t C, F f) {
  const int64_t k4 = (C / 4 + 31) / 32;
  if (k4 <= 2) return f(std::integral_constant<int, 2>{});
  if (k4 <= 4) return f(std::integral_constant<int, 4>{});
  if (k4 <= 6) return f(std::integral_constant<int, 6>{});
  if (k4 <= 8) return f(std::integral_constant<int, 8>{});
  if (k4 <= 13) return f(std::integral_constant<int, 13>{});
  f(std::integral_constant<int, 16>{});
}
// Layernorm forward: the register kernel where the row fits (C % 4 == 0, aligned, C <= 2048), else k_ln_fwd.
template <class Y>
void ln_fwd(const float* x, const float* w, const float* b, Y* y, float* mean, float* rstd, int64_t N, int64_t C,
            float eps, bool bf) {
  auto go = [&](auto kernel) {
    kernel<<<rows_grid(N), kTpb, 0, cuda::stream()>>>(x, w, b, y, mean, rstd, N, C, eps, bf);
    ZR_CUDA(cudaGetLastError());
  };
  if (C % 4 != 0 || C > 2048 || !aligned16(x) || !aligned16(w) || !aligned16(b) || !aligned16(y))
    return go(k_ln_fwd<Y>);  // (a null bias counts as aligned)
  with_k4(C, [&](auto k4) { go(k_ln_fwd_reg<Y, decltype(k4)::value>); });
}

}  // namespace

void CudaBackend::layernorm_fwd16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd,
                                  int64_t N, int64_t C, float eps) {
  if (!N) return;
  ln_fwd<uint16_t>(x, w, b, y, mean, rstd, N, C, eps, mm_ == DType::BF16);
}

void CudaBackend::qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N,
                              int64_t H, int64_t K, int64_t D, bool full, float eps) {
  qk::norm_fwd(x, wq, wk, y, rstd, N, H, K, D, full, eps, cuda::stream());
}

void CudaBackend::qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy,
                              Grad dx, float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) {
  ZR_CHECK(!dx.h, "qk_norm takes an f32 gradient");
  qk::norm_bwd(x, wq, wk, rstd, dy, dx.p, dx.acc, dwq, dwk, N, H, K, D, full, cuda::stream());
}

void CudaBackend::layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                int64_t N, int64_t C, float eps) {
  if (!N) return;
  ln_fwd<float>(x, w, b, y, mean, rstd, N, C, eps, false);
}

void CudaBackend::layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                                Grad dx, float* dw, float* db, int64_t N, int64_t C) {
  norm_bwd(x, w, mean, rstd, dy, dx, dw, db, N, C, false);
}

void CudaBackend::layernorm_bwd16(const float* x, const float* w, const float* mean, const float* rstd,
                                  const uint16_t* dy, Grad dx, float* dw, float* db, int64_t N, int64_t C) {
  norm_bwd(x, w, mean, rstd, dy, dx, dw, db, N, C, mm_ == DType::BF16);
}

// The layernorm backward (mean null: rmsnorm's, no db) for an f32 or 16-bit dy: the one-pass kernel where it
// fits, else the dx kernel and the column sums.
template <class D>
void CudaBackend::norm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, Grad dx,
                           float* dw, float* db, int64_t N, int64_t C, bool bf) {
  if (!N) return;
  ZR_CHECK(!dx.h, mean ? "a layernorm's" : "an rmsnorm's", " input gradient is f32");
  if (ln_bwd_fused(x, w, mean, rstd, dy, dx, dw, db, N, C, bf)) return;
  if (dx) k_ln_bwd_dx<D><<<rows_grid(N), kTpb, 0, cuda::stream()>>>(x, w, mean, rstd, dy, dx.p, dx.acc, N, C, bf);
  if (dw || db) column_sums(LnWB<D>{x, mean, rstd, dy, bf}, N, C, dw, db);
  ZR_CUDA(cudaGetLastError());
}

// rmsnorm: the layernorm kernels without mean (no centring) and bias.
void CudaBackend::rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) {
  if (N) ln_fwd<float>(x, w, nullptr, y, nullptr, rstd, N, C, eps, false);
}

void CudaBackend::rmsnorm_fwd16(const float* x, const float* w, uint16_t* y, float* rstd, int64_t N, int64_t C,
                                float eps) {
  if (N) ln_fwd<uint16_t>(x, w, nullptr, y, nullptr, rstd, N, C, eps, mm_ == DType::BF16);
}

void CudaBackend::rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, Grad dx, float* dw,
                              int64_t N, int64_t C) {
  norm_bwd(x, w, nullptr, rstd, dy, dx, dw, nullptr, N, C, false);
}

void CudaBackend::rmsnorm_bwd16(const float* x, const float* w, const float* rstd, const uint16_t* dy, Grad dx,
                                float* dw, int64_t N, int64_t C) {
  norm_bwd(x, w, nullptr, rstd, dy, dx, dw, nullptr, N, C, mm_ == DType::BF16);
}

// The one-pass layernorm backward where C fits (and dw, db both wanted); false: not taken.
template <class D>
bool CudaBackend::ln_bwd_fused(const float* x, const float* w, const float* mean, const float* rstd, const D* dy,
                               Grad dx, float* dw, float* db, int64_t N, int64_t C, bool bf) {
  const bool v4 =
      C % 4 == 0 && C <= 2048 && aligned16(x) && aligned16(w) && aligned16(dy) && (!dx.p || aligned16(dx.p));
  if (!dw || (!db && mean) || (C > 1024 && !v4)) return false;  // (rmsnorm: no mean, no db)
  int64_t chunks = 0;
  DevBuf<float> part;
  // smem: the launch's dynamic shared memory; most: the largest any launch of `kernel` takes (allowed, and the
  // wave sized, for that: one setting for every C).
  auto go = [&](auto kernel, size_t smem = 0, size_t most = 0) {
    // One wave of blocks: rows a block = N over the blocks the GPU holds at once, a multiple of the 8 warps
    // (16 rows a block left 1.3 waves at GPT-2 124M's 8192 rows and a half-empty wave at 1.5B's 2048).
    const int64_t rows_per = round_up(ceil_div(N, wave_blocks(kernel, most)), 8);
    chunks = ceil_div(N, rows_per);
    part = DevBuf<float>(static_cast<size_t>(2 * chunks * C), false);
    kernel<<<static_cast<unsigned>(chunks), 256, smem, cuda::stream()>>>(x, w, mean, rstd, dy, dx.p, dx.acc, N, C,
                                                                         rows_per, part.p, bf);
    ZR_CUDA(cudaGetLastError());
  };
  if (v4)
    with_k4(C, [&](auto k4) {
      constexpr int K4 = decltype(k4)::value;
      go(k_ln_bwd_sm<D, K4>, static_cast<size_t>(17 * C) * sizeof(float), 17 * 128 * K4 * sizeof(float));
    });
  else if (C <= 256)
    go(k_ln_bwd_fused<D, 8>);
  else if (C <= 512)
    go(k_ln_bwd_fused<D, 16>);
  else if (C <= 768)
    go(k_ln_bwd_fused<D, 24>);
  else
    go(k_ln_bwd_fused<D, 32>);
  col_final(part.p, chunks, C, dw, db, true);
  return true;
}

}  // namespace zerorun::kernels
