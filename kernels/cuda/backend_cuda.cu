// The CUDA backend: every op's forward and backward, optimizer updates and
// reductions on the GPU (cuBLAS for products, hand-written kernels for the
// rest), on the one stream of cuda::stream(). Checked against the CPU backend op by op
// (tests/unit/test_cuda_ops.cc, run on the device machine).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_cached.h"
#include "cuda_check.h"
#include "device_util.h"
#include "flash_attention.h"
#include "kernels/backend.h"
#include "kernels/optim_math.h"
#include "lt_gemm.h"
#include "qk_norm.h"
#include "rope.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/profile.h"

namespace zerorun::kernels {
namespace {

constexpr int kTpb = 256;
inline unsigned grid_for(int64_t n) {
  int64_t b = (n + kTpb - 1) / kTpb;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, 1 << 20)));
}
#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                                       \
  do {                                                               \
    if ((n) > 0) {                                                   \
      kernel<<<grid_for(n), kTpb, 0, cuda::stream()>>>(__VA_ARGS__); \
      ZR_CUDA(cudaGetLastError());                                   \
    }                                                                \
  } while (0)

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions for blocks of kTpb threads.
__device__ inline float block_sum(float v) {
  __shared__ float sh[32];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? sh[lane] : 0.f;
  if (w == 0) v = warp_sum(v);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}

// ---- elementwise --------------------------------------------------------------
// Memory-bound maps run 4 elements per thread through float4 loads when every
// pointer is 16-byte aligned (views at odd offsets take the scalar kernel).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__device__ inline float4 ld4(const float* p, int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ inline void st4(float* p, int64_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
// Four values rounded to 16 bits, packed in order into one 8-byte word.
__device__ inline uint2 pack4_16(bool bf, float a, float b, float c, float d) {
  return make_uint2(static_cast<uint32_t>(to16_bits(bf, a)) | (static_cast<uint32_t>(to16_bits(bf, b)) << 16),
                    static_cast<uint32_t>(to16_bits(bf, c)) | (static_cast<uint32_t>(to16_bits(bf, d)) << 16));
}

// y = f(a, b) (b null: f(a, 0)) when Upd is false; y = f(a, b, y) when true.
template <bool Upd, class F>
__device__ inline float ew(const F& f, float a, float b, float y) {
  if constexpr (Upd)
    return f(a, b, y);
  else
    return f(a, b);
}
template <bool Upd, bool V4, class F>
__global__ void k_ew(F f, const float* a, const float* b, float* y, int64_t n) {
  if constexpr (V4) {
    GRID_STRIDE(i, n / 4) {
      const float4 x = ld4(a, i), z = b ? ld4(b, i) : make_float4(0, 0, 0, 0);
      float4 o = Upd ? ld4(y, i) : make_float4(0, 0, 0, 0);
      o = make_float4(ew<Upd>(f, x.x, z.x, o.x), ew<Upd>(f, x.y, z.y, o.y), ew<Upd>(f, x.z, z.z, o.z),
                      ew<Upd>(f, x.w, z.w, o.w));
      st4(y, i, o);
    }
    for (int64_t i = n / 4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
      y[i] = ew<Upd>(f, a[i], b ? b[i] : 0.f, Upd ? y[i] : 0.f);
  } else {
    GRID_STRIDE(i, n) y[i] = ew<Upd>(f, a[i], b ? b[i] : 0.f, Upd ? y[i] : 0.f);
  }
}
template <bool Upd, class F>
void elementwise(F f, const float* a, const float* b, float* y, int64_t n) {
  if (n <= 0) return;
  if (aligned16(a) && aligned16(y) && (!b || aligned16(b)))
    k_ew<Upd, true><<<grid_for((n + 3) / 4), kTpb, 0, cuda::stream()>>>(f, a, b, y, n);
  else
    k_ew<Upd, false><<<grid_for(n), kTpb, 0, cuda::stream()>>>(f, a, b, y, n);
  ZR_CUDA(cudaGetLastError());
}
struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AccA {  // y += a
  __device__ float operator()(float a, float, float y) const { return y + a; }
};

__global__ void k_bias_add(float* y, const float* b, int64_t n, int64_t out) { GRID_STRIDE(i, n) y[i] += b[i % out]; }
__global__ void k_add(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
  GRID_STRIDE(i, n) y[i] = a[i] + b[i % nb];
}
constexpr float kGeluC = 0.7978845608028654f;
template <int A>  // 0 gelu (tanh), 1 relu, 2 silu
struct ActF {
  __device__ float operator()(float v, float) const {
    if constexpr (A == 0)
      return 0.5f * v * (1.f + tanhf(kGeluC * (v + 0.044715f * v * v * v)));
    else if constexpr (A == 1)
      return v > 0.f ? v : 0.f;
    else
      return v / (1.f + expf(-v));
  }
};
template <int A>  // act'(x)
__device__ inline float act_grad(float v) {
  float d;
  if constexpr (A == 0) {
    float t = tanhf(kGeluC * (v + 0.044715f * v * v * v));
    d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * 0.044715f * v * v);
  } else if constexpr (A == 1) {
    d = v > 0.f ? 1.f : 0.f;
  } else {
    float s = 1.f / (1.f + expf(-v));
    d = s * (1.f + v * (1.f - s));
  }
  return d;
}
template <int A>  // dx += dy * act'(x)
struct ActB {
  __device__ float operator()(float v, float dy, float dx) const { return dx + dy * act_grad<A>(v); }
};
template <int A>  // dx = dy * act'(x)
struct ActBW {
  __device__ float operator()(float v, float dy) const { return dy * act_grad<A>(v); }
};
// Loads and stores for f32 or 16-bit (bf: bfloat16, else fp16) storage; 16-bit stores never accumulate.
template <class T>
__device__ inline float ld1(const T* p, int64_t i, bool bf) {
  if constexpr (sizeof(T) == 2)
    return from16(bf, p[i]);
  else
    return p[i];
}
template <class T>
__device__ inline float4 ldv4(const T* p, int64_t i, bool bf) {
  if constexpr (sizeof(T) == 2) {
    const ushort4 u = reinterpret_cast<const ushort4*>(p)[i];
    return make_float4(from16(bf, u.x), from16(bf, u.y), from16(bf, u.z), from16(bf, u.w));
  } else {
    return reinterpret_cast<const float4*>(p)[i];
  }
}
template <class T>
__device__ inline void st1(T* p, int64_t i, float v, bool acc, bool bf) {
  if constexpr (sizeof(T) == 2)
    p[i] = to16_bits(bf, v);
  else
    p[i] = acc ? p[i] + v : v;
}
template <class T>
__device__ inline void stv4(T* p, int64_t i, float4 v, bool acc, bool bf) {
  if constexpr (sizeof(T) == 2) {
    reinterpret_cast<ushort4*>(p)[i] =
        make_ushort4(to16_bits(bf, v.x), to16_bits(bf, v.y), to16_bits(bf, v.z), to16_bits(bf, v.w));
  } else {
    if (acc) {
      const float4 o = reinterpret_cast<const float4*>(p)[i];
      v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
    }
    reinterpret_cast<float4*>(p)[i] = v;
  }
}
// y (+)= f(a, b) over mixed storage (b may be null); four elements per thread when v4 (all aligned).
template <class F, class X, class Z, class Y>
__global__ void k_map(F f, const X* a, const Z* b, Y* y, int64_t n, bool acc, bool bf, bool v4) {
  int64_t start = 0;
  if (v4) {
    GRID_STRIDE(i, n / 4) {
      const float4 x = ldv4(a, i, bf), z = b ? ldv4(b, i, bf) : make_float4(0, 0, 0, 0);
      stv4(y, i, make_float4(f(x.x, z.x), f(x.y, z.y), f(x.z, z.z), f(x.w, z.w)), acc, bf);
    }
    start = n / 4 * 4;
  }
  for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st1(y, i, f(ld1(a, i, bf), b ? ld1(b, i, bf) : 0.f), acc, bf);
}
template <class F, class X, class Z, class Y>
void map_mixed(F f, const X* a, const Z* b, Y* y, int64_t n, bool acc, bool bf) {
  if (n <= 0) return;
  auto al = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const bool v4 = al(a, 4 * sizeof(X)) && (!b || al(b, 4 * sizeof(Z))) && al(y, 4 * sizeof(Y));
  k_map<<<grid_for(v4 ? (n + 3) / 4 : n), kTpb, 0, cuda::stream()>>>(f, a, b, y, n, acc, bf, v4);
  ZR_CUDA(cudaGetLastError());
}
// The activation function A on the kernel's (x, unused) / its derivative times dy on (x, dy).
constexpr const float* kNoB = nullptr;
template <int A>
void act_fwd_any(Src x, Dst y, int64_t n, bool bf) {
  if (x.h && y.h)
    map_mixed(ActF<A>{}, x.h, kNoB, y.h, n, false, bf);
  else if (x.h)
    map_mixed(ActF<A>{}, x.h, kNoB, y.p, n, false, bf);
  else if (y.h)
    map_mixed(ActF<A>{}, x.p, kNoB, y.h, n, false, bf);
  else
    map_mixed(ActF<A>{}, x.p, kNoB, y.p, n, false, bf);
}
template <int A, class X, class D>
void act_bwd_any(const X* x, const D* dy, Grad dx, int64_t n, bool bf) {
  if (dx.h)
    map_mixed(ActBW<A>{}, x, dy, dx.h, n, false, bf);
  else
    map_mixed(ActBW<A>{}, x, dy, dx.p, n, dx.acc, bf);
}
// x and dy each f32 or 16-bit.
template <int A>
void act_bwd_src(Src x, Src dy, Grad dx, int64_t n, bool bf) {
  if (x.p && dy.p)
    act_bwd_any<A>(x.p, dy.p, dx, n, bf);
  else if (x.p)
    act_bwd_any<A>(x.p, dy.h, dx, n, bf);
  else if (dy.p)
    act_bwd_any<A>(x.h, dy.p, dx, n, bf);
  else
    act_bwd_any<A>(x.h, dy.h, dx, n, bf);
}
struct Ident {
  __device__ float operator()(float v, float) const { return v; }
};
// Two-input elementwise maps (mul, SwiGLU) over f32 or 16-bit storage on each side (chosen per pointer: the
// branches are uniform), four elements a thread when v4 (every pointer aligned for its 4-element access).
__device__ inline float ld1s(Src s, int64_t i, bool bf) { return s.h ? from16(bf, s.h[i]) : s.p[i]; }
__device__ inline float4 ld4s(Src s, int64_t i, bool bf) { return s.h ? ldv4(s.h, i, bf) : ldv4(s.p, i, bf); }
__device__ inline void st1g(Grad d, int64_t i, float v, bool bf) {
  if (d.h)
    st1(d.h, i, v, false, bf);
  else if (d.p)
    st1(d.p, i, v, d.acc, bf);
}
__device__ inline void st4g(Grad d, int64_t i, float4 v, bool bf) {
  if (d.h)
    stv4(d.h, i, v, false, bf);
  else if (d.p)
    stv4(d.p, i, v, d.acc, bf);
}
// Two-input elementwise ops y = F(a, b) with F::grad giving da, db from (a, b, dy).
struct MulF {
  __device__ float operator()(float a, float b) const { return a * b; }
  __device__ void grad(float a, float b, float dy, float& da, float& db) const { da = dy * b, db = dy * a; }
};
struct SwiGluF {  // silu(g) * u
  __device__ float operator()(float g, float u) const { return g / (1.f + expf(-g)) * u; }
  __device__ void grad(float g, float u, float dy, float& dg, float& du) const {
    const float s = 1.f / (1.f + expf(-g));
    dg = dy * u * s * (1.f + g * (1.f - s));
    du = dy * g * s;
  }
};
struct GeGluF {  // gelu_tanh(g) * u
  __device__ float operator()(float g, float u) const { return ActF<0>{}(g, 0.f) * u; }
  __device__ void grad(float g, float u, float dy, float& dg, float& du) const {
    dg = dy * u * act_grad<0>(g);
    du = dy * ActF<0>{}(g, 0.f);
  }
};
template <class F>
__global__ void k_pair_fwd(F f, Src a, Src b, Grad y, int64_t n, bool bf, bool v4) {
  int64_t start = 0;
  if (v4) {
    GRID_STRIDE(i, n / 4) {
      const float4 x = ld4s(a, i, bf), z = ld4s(b, i, bf);
      st4g(y, i, make_float4(f(x.x, z.x), f(x.y, z.y), f(x.z, z.z), f(x.w, z.w)), bf);
    }
    start = n / 4 * 4;
  }
  for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st1g(y, i, f(ld1s(a, i, bf), ld1s(b, i, bf)), bf);
}
template <class F>
__global__ void k_pair_bwd(F f, Src a, Src b, Src dy, Grad da, Grad db, int64_t n, bool bf, bool v4) {
  int64_t start = 0;
  if (v4) {
    GRID_STRIDE(i, n / 4) {
      const float4 x = ld4s(a, i, bf), z = ld4s(b, i, bf), d = ld4s(dy, i, bf);
      float4 o, p;
      f.grad(x.x, z.x, d.x, o.x, p.x);
      f.grad(x.y, z.y, d.y, o.y, p.y);
      f.grad(x.z, z.z, d.z, o.z, p.z);
      f.grad(x.w, z.w, d.w, o.w, p.w);
      st4g(da, i, o, bf);
      st4g(db, i, p, bf);
    }
    start = n / 4 * 4;
  }
  for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float o, p;
    f.grad(ld1s(a, i, bf), ld1s(b, i, bf), ld1s(dy, i, bf), o, p);
    st1g(da, i, o, bf);
    st1g(db, i, p, bf);
  }
}
// Whether a Src / Dst / Grad pointer allows the 4-element accesses (8 bytes for 16-bit storage, 16 for f32).
inline bool al4(const void* p, const void* h) {
  return h ? reinterpret_cast<uintptr_t>(h) % 8 == 0 : reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
template <class F>
void pair_fwd(F f, Src a, Src b, Dst y, int64_t n, bool bf) {
  if (n <= 0) return;
  Grad out;  // written, never added to
  out.p = y.p, out.h = y.h, out.acc = false;
  const bool v4 = al4(a.p, a.h) && al4(b.p, b.h) && al4(y.p, y.h);
  k_pair_fwd<<<grid_for(v4 ? (n + 3) / 4 : n), kTpb, 0, cuda::stream()>>>(f, a, b, out, n, bf, v4);
  ZR_CUDA(cudaGetLastError());
}
template <class F>
void pair_bwd(F f, Src a, Src b, Src dy, Grad da, Grad db, int64_t n, bool bf) {
  if (n <= 0 || (!da && !db)) return;
  const bool v4 =
      al4(a.p, a.h) && al4(b.p, b.h) && al4(dy.p, dy.h) && (!da || al4(da.p, da.h)) && (!db || al4(db.p, db.h));
  k_pair_bwd<<<grid_for(v4 ? (n + 3) / 4 : n), kTpb, 0, cuda::stream()>>>(f, a, b, dy, da, db, n, bf, v4);
  ZR_CUDA(cudaGetLastError());
}
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
// Column sums of an N x C matrix, two at a time (layernorm's dw and db share a
// pass), without atomics so results are bitwise reproducible: blocks of 32
// columns x a chunk of rows write partial sums, a second kernel adds the
// chunks in order. F(row, col) returns the two values to sum.
struct ColOf {  // sums dy itself (bias gradients, broadcast add)
  const float* dy;
  __device__ float2 operator()(int64_t r, int64_t c, int64_t C) const { return {dy[r * C + c], 0.f}; }
};
struct ColOf16 {  // sums a 16-bit dy (bias gradients from 16-bit gradients)
  const uint16_t* dy;
  bool bf;
  __device__ float2 operator()(int64_t r, int64_t c, int64_t C) const { return {from16(bf, dy[r * C + c]), 0.f}; }
};
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
constexpr int kColRows = 8;  // threadIdx.y extent
template <class F>
__global__ void k_col_partial(F f, int64_t N, int64_t C, int64_t rows_per, float* part) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float s0 = 0.f, s1 = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      float2 v = f(r, c, C);
      s0 += v.x;
      s1 += v.y;
    }
  __shared__ float sh[2][kColRows][33];
  sh[0][threadIdx.y][threadIdx.x] = s0;
  sh[1][threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float a = 0.f, b = 0.f;
    for (int k = 0; k < kColRows; ++k) a += sh[0][k][threadIdx.x], b += sh[1][k][threadIdx.x];
    part[(2 * blockIdx.y) * C + c] = a;
    part[(2 * blockIdx.y + 1) * C + c] = b;
  }
}
// Adds the chunks' partial sums: block (32 columns, kFinalRows), each thread row sums every
// kFinalRows-th chunk, then the rows are added in a fixed order (reproducible, no atomics).
constexpr int kFinalRows = 32;
__global__ void k_col_final(const float* part, int64_t chunks, int64_t C, float* o0, float* o1, bool acc) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (c < C)
    for (int64_t k = threadIdx.y; k < chunks; k += kFinalRows) a += part[2 * k * C + c], b += part[(2 * k + 1) * C + c];
  __shared__ float sh[2][kFinalRows][33];
  sh[0][threadIdx.y][threadIdx.x] = a;
  sh[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    a = 0.f, b = 0.f;
    for (int k = 0; k < kFinalRows; ++k) a += sh[0][k][threadIdx.x], b += sh[1][k][threadIdx.x];
    if (o0) o0[c] = (acc ? o0[c] : 0.f) + a;
    if (o1) o1[c] = (acc ? o1[c] : 0.f) + b;
  }
}
void col_final(const float* part, int64_t chunks, int64_t C, float* o0, float* o1, bool acc) {
  if (C <= 0) return;
  k_col_final<<<static_cast<unsigned>((C + 31) / 32), dim3(32, kFinalRows), 0, cuda::stream()>>>(part, chunks, C, o0,
                                                                                                 o1, acc);
  ZR_CUDA(cudaGetLastError());
}
// The end of a one-kernel column sum over a grid of (column blocks, row chunks): called by every thread of a block
// after its partials part[blockIdx.y * C + c] are written; the last block of each column block to finish (`done`:
// one zeroed counter per column block, re-zeroed by that block) adds every chunk's partial in chunk order into
// out[c] (acc: added to), for the columns its threads `own` — the same sums whichever block comes last.
__device__ inline void finish_columns(const float* part, unsigned* done, float* out, bool acc, int64_t C, int64_t c,
                                      bool own) {
  __shared__ bool last;
  __threadfence();  // this block's partials are visible before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(done + blockIdx.x, 1u) == gridDim.y - 1;
    if (last) done[blockIdx.x] = 0;  // for the next launch (kernels on the stream run one after another)
  }
  __syncthreads();
  if (!last || !own) return;
  __threadfence();
  // Four independent sums (chunk k into sum k % 4) keep four L2 reads in flight; the order is fixed.
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  const int64_t nk = gridDim.y;
  int64_t k = 0;
  for (; k + 4 <= nk; k += 4)
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] += __ldcg(part + (k + u) * C + c);  // L2: other blocks wrote them
  for (; k < nk; ++k) v[k % 4] += __ldcg(part + k * C + c);
  out[c] = (acc ? out[c] : 0.f) + ((v[0] + v[1]) + (v[2] + v[3]));
}
// out[c] (+)= the column sums of a 16-bit N x C matrix (C % 8 == 0, 16-byte aligned rows) in one kernel: eight
// columns per thread from one 16-byte load, a block covering 256 columns x a chunk of rows writes its partial
// (part: chunks x C), finish_columns adds them.
__global__ void k_col16_sum(const uint16_t* dy, bool bf, int64_t N, int64_t C, int64_t rows_per, float* part,
                            unsigned* done, float* out, bool acc) {
  const int64_t c0 = blockIdx.x * 256 + threadIdx.x * 8;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (c0 < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const uint4 u = *reinterpret_cast<const uint4*>(dy + r * C + c0);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[2 * i] += from16(bf, static_cast<uint16_t>(w[i] & 0xffffu));
        a[2 * i + 1] += from16(bf, static_cast<uint16_t>(w[i] >> 16));
      }
    }
  __shared__ float sh[kColRows][256 + 8];
#pragma unroll
  for (int i = 0; i < 8; ++i) sh[threadIdx.y][threadIdx.x * 8 + i] = a[i];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x;  // one column per thread
  const int64_t c = blockIdx.x * 256 + t;
  if (c < C) {
    float v = 0.f;
    for (int k = 0; k < kColRows; ++k) v += sh[k][t];
    part[blockIdx.y * C + c] = v;
  }
  finish_columns(part, done, out, acc, C, c, c < C);
}
// The linear backward's dy rounded to 16 bits (d) in the same pass that sums its
// columns for the bias gradient (partials as k_col_partial's, .y unused).
__global__ void k_to16_colsum(bool bf, const float* dy, uint16_t* d, int64_t N, int64_t C, int64_t rows_per,
                              float* part) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float s0 = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float v = dy[r * C + c];
      d[r * C + c] = to16_bits(bf, v);
      s0 += v;
    }
  __shared__ float sh[kColRows][33];
  sh[threadIdx.y][threadIdx.x] = s0;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float a = 0.f;
    for (int k = 0; k < kColRows; ++k) a += sh[k][threadIdx.x];
    part[(2 * blockIdx.y) * C + c] = a;
    part[(2 * blockIdx.y + 1) * C + c] = 0.f;
  }
}
// k_to16_colsum with four columns a thread (C % 4 == 0, 16-byte aligned rows): a block covers 128 columns, and the
// column sums are finished in the same kernel (finish_columns; part: chunks x C) instead of by col_final.
__global__ void k_to16_colsum4(bool bf, const float* dy, uint16_t* d, int64_t N, int64_t C, int64_t rows_per,
                               float* part, unsigned* done, float* out, bool acc) {
  const int64_t c0 = blockIdx.x * 128 + threadIdx.x * 4;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
  float a[4] = {0.f, 0.f, 0.f, 0.f};
  if (c0 < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float4 v = *reinterpret_cast<const float4*>(dy + r * C + c0);
      *reinterpret_cast<uint2*>(d + r * C + c0) = pack4_16(bf, v.x, v.y, v.z, v.w);
      a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
    }
  __shared__ float sh[kColRows][128 + 4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sh[threadIdx.y][threadIdx.x * 4 + i] = a[i];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x;
  const int64_t c = blockIdx.x * 128 + t;
  if (t < 128 && c < C) {
    float v = 0.f;
    for (int k = 0; k < kColRows; ++k) v += sh[k][t];
    part[blockIdx.y * C + c] = v;
  }
  finish_columns(part, done, out, acc, C, c, t < 128 && c < C);
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }
unsigned rows_grid(int64_t N) { return static_cast<unsigned>((N + 7) / 8); }  // 8 warps per 256-thread block
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

// ---- attention helpers: warp per row of [rows, T] ---------------------------------
// Row t's scores s0(t) .. t (the sliding window's first key, or 0; pos [B, T] non-null: no key before t's document,
// t - pos[b, t]; rows are [B, H, T]) soft-capped where asked, then the softmax; zeros elsewhere.
__global__ void k_causal_softmax(float* P, int64_t rows, int64_t T, int64_t window, float softcap, const int32_t* pos,
                                 int64_t H) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t t = row % T, s0 = window > 0 && t >= window ? t - window + 1 : 0;
  if (pos) s0 = max(s0, t - (int64_t)pos[row / (H * T) * T + t]);
  float* p = P + row * T;
  float mx = -INFINITY;
  for (int64_t s = s0 + lane; s <= t; s += 32) {
    if (softcap > 0.f) p[s] = softcap * tanhf(p[s] / softcap);
    mx = fmaxf(mx, p[s]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t s = s0 + lane; s <= t; s += 32) {
    float e = expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  float inv = 1.f / warp_sum(sum);
  for (int64_t s = lane; s < T; s += 32) p[s] = s >= s0 && s <= t ? p[s] * inv : 0.f;
}
// dS = P * (dP - rowsum(P * dP)) * scale (times the soft-cap's derivative 1 - tanh^2(S / softcap), S the scaled
// scores, where softcap > 0), in place over dP.
__global__ void k_softmax_bwd(const float* P, float* dP, const float* S, int64_t rows, int64_t T, float scale,
                              float softcap) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* p = P + row * T;
  float* d = dP + row * T;
  float dot = 0.f;
  for (int64_t s = lane; s < T; s += 32) dot += p[s] * d[s];
  dot = warp_sum(dot);
  if (softcap > 0.f) {
    const float* x = S + row * T;
    for (int64_t s = lane; s < T; s += 32) {
      const float th = tanhf(x[s] / softcap);
      d[s] = p[s] * (d[s] - dot) * (1.f - th * th) * scale;
    }
    return;
  }
  for (int64_t s = lane; s < T; s += 32) d[s] = p[s] * (d[s] - dot) * scale;
}

// ---- embeddings ------------------------------------------------------------------
// Marks the first failing check: *bad = code unless an earlier one is there.
__global__ void k_ids_check(const int32_t* ids, int64_t n, int64_t V, int* bad, int code, int32_t ignore = INT32_MIN) {
  GRID_STRIDE(i, n) if ((ids[i] < 0 || ids[i] >= V) && ids[i] != ignore) atomicCAS(bad, 0, code);
}
// Ids outside the table (reported by the deferred check) read zeros and get no gradient: no stray accesses.
__global__ void k_emb_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t V) {
  GRID_STRIDE(i, N * C) {
    const int64_t id = ids[i / C];
    out[i] = id >= 0 && id < V ? table[id * C + i % C] : 0.f;
  }
}
__global__ void k_emb_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) {
  GRID_STRIDE(i, N * C) {
    const int64_t id = ids[i / C];
    if (id >= 0 && id < V) atomicAdd(&dtable[id * C + i % C], dout[i]);
  }
}
// The deterministic embedding gradient: the positions sorted by id with a stable radix sort (keys: the id, or V
// for an id outside the table), then fixed chunks of kEmbChunk sorted positions, one block each, add every run of
// one id in position order. A run that lies inside its chunk goes straight into the table's row (no other block
// writes that row). A run that crosses a chunk boundary leaves its chunk's partial sum (slot 0: the chunk's first
// run, slot 1: its last), and k_emb_bwd_spans, one block for the chunk where such a run starts, adds those
// partials in chunk order into the row. The same bits every run, where the atomic kernel adds a repeated id in
// whatever order the blocks happen to run; and a token filling most of the batch is split over many blocks
// instead of making one block a long tail.
constexpr int64_t kEmbChunk = 32;
__global__ void k_emb_keys(const int32_t* ids, int64_t N, int64_t V, uint32_t* keys, int32_t* pos) {
  GRID_STRIDE(i, N) {
    const int32_t id = ids[i];
    keys[i] = id >= 0 && id < V ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
    pos[i] = static_cast<int32_t>(i);
  }
}
// Column group c of a row as VEC floats (VEC = 4: C % 4 == 0 and 16-byte aligned rows).
template <int VEC>
struct EmbCols {
  using T = std::conditional_t<VEC == 4, float4, float>;
  static __device__ T zero() {
    if constexpr (VEC == 4)
      return make_float4(0.f, 0.f, 0.f, 0.f);
    else
      return 0.f;
  }
  static __device__ void add(T& s, const T& d) {
    if constexpr (VEC == 4)
      s.x += d.x, s.y += d.y, s.z += d.z, s.w += d.w;
    else
      s += d;
  }
};
template <int VEC>
__global__ void k_emb_bwd_chunks(const uint32_t* key, const int32_t* pos, const float* dout, float* dtable, float* part,
                                 int64_t N, int64_t C, int64_t V) {
  using Ops = EmbCols<VEC>;
  using T = typename Ops::T;
  const int64_t cols = C / VEC;
  for (int64_t b = blockIdx.x; b * kEmbChunk < N; b += gridDim.x) {
    const int64_t lo = b * kEmbChunk, hi = lo + kEmbChunk < N ? lo + kEmbChunk : N;
    const uint32_t first = key[lo], last = key[hi - 1];
    const bool head_span = lo > 0 && key[lo - 1] == first, tail_span = hi < N && key[hi] == last;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      T s = Ops::zero();
      for (int64_t j = lo; j < hi; ++j) {
        Ops::add(s, reinterpret_cast<const T*>(dout + static_cast<int64_t>(pos[j]) * C)[c]);
        const uint32_t id = key[j];
        if (j + 1 < hi && key[j + 1] == id) continue;  // the run goes on
        if (id < V) {
          const bool is_first = id == first;
          if ((is_first && head_span) || (id == last && tail_span))
            reinterpret_cast<T*>(part + (2 * b + (is_first ? 0 : 1)) * C)[c] = s;
          else
            Ops::add(reinterpret_cast<T*>(dtable + id * C)[c], s);
        }
        s = Ops::zero();
      }
    }
  }
}
template <int VEC>
__global__ void k_emb_bwd_spans(const uint32_t* key, const float* part, float* dtable, int64_t N, int64_t C,
                                int64_t V) {
  using Ops = EmbCols<VEC>;
  using T = typename Ops::T;
  const int64_t cols = C / VEC;
  for (int64_t b = blockIdx.x; b * kEmbChunk < N; b += gridDim.x) {
    const int64_t lo = b * kEmbChunk, hi = lo + kEmbChunk < N ? lo + kEmbChunk : N;
    const uint32_t id = key[hi - 1];
    if (id >= V || hi >= N || key[hi] != id) continue;           // the last run ends here: written by its chunk
    if (key[lo] == id && lo > 0 && key[lo - 1] == id) continue;  // the run started in an earlier chunk
    const int64_t slot = key[lo] == id ? 0 : 1;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      T s = reinterpret_cast<const T*>(part + (2 * b + slot) * C)[c];
      for (int64_t k = b + 1;; ++k) {  // chunk k starts with the run: its slot 0
        Ops::add(s, reinterpret_cast<const T*>(part + 2 * k * C)[c]);
        const int64_t next = (k + 1) * kEmbChunk;
        if (next >= N || key[next] != id) break;
      }
      Ops::add(reinterpret_cast<T*>(dtable + id * C)[c], s);
    }
  }
}
__global__ void k_pos_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE(i, B * T * C) out[i] = table[i % (T * C)];
}
__global__ void k_pos_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE(i, T * C) {
    float s = 0.f;
    for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
    dtable[i] += s;
  }
}

// ---- losses: one block per row ------------------------------------------------------
// One pass per row: running (max, sum of exp) per thread, merged across the block.
__device__ inline void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
__device__ inline void online_merge(float& m, float& s, float m2, float s2) {
  float mn = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mn));
  m = mn;
}
__device__ inline void warp_online_merge(float& m, float& s) {
  for (int o = 16; o > 0; o >>= 1)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}
// The log-sum-exp of a row of V logits, one pass (running max and sum per thread, merged across the block),
// returned to every thread of the block.
template <class L>
__device__ inline float block_row_lse(const L* l, int64_t V, bool bf) {
  float m = -INFINITY, s = 0.f;
  if (V % 4 == 0) {  // four at a time: one rescale per four (not a branch per element), exp2 on log2e-scaled
    constexpr float L2E = 1.4426950408889634f;
    for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = ldv4(l, v, bf);
      const float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
      if (mx > m) {
        s *= exp2f((m - mx) * L2E);  // m = -inf on the first: s is 0 then
        m = mx;
      }
      s += exp2f((x.x - m) * L2E) + exp2f((x.y - m) * L2E) + exp2f((x.z - m) * L2E) + exp2f((x.w - m) * L2E);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) online_add(m, s, ld1(l, v, bf));
  }
  warp_online_merge(m, s);
  __shared__ float sm[32], ss[32], zs;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sm[w] = m, ss[w] = s;
  __syncthreads();
  if (w == 0) {
    m = lane < blockDim.x / 32 ? sm[lane] : -INFINITY;
    s = lane < blockDim.x / 32 ? ss[lane] : 0.f;
    warp_online_merge(m, s);
    if (lane == 0) zs = logf(s) + m;
  }
  __syncthreads();
  return zs;
}
template <class L>  // logits in f32 or 16 bits
__global__ void k_ce_fwd(const L* logits, const int32_t* targets, float* row_loss, float* lse, int64_t V, bool bf) {
  const L* l = logits + blockIdx.x * V;
  const float z = block_row_lse(l, V, bf);
  if (threadIdx.x == 0) {
    lse[blockIdx.x] = z;
    const int32_t t = targets[blockIdx.x];  // outside [0, V): reported by the deferred id check
    row_loss[blockIdx.x] = t >= 0 && t < V ? z - ld1(l, t, bf) : 0.f;
  }
}
// Cross-entropy forward and backward in one read of each row (the backward's d(loss) is known before the
// forward): row_loss = lse - logit[target], then the row is overwritten in place with
// dloss * (softmax - onehot) / N. 16-bit logits, V % 4 == 0; 1024 threads so the rows in flight (two blocks an SM)
// stay in L2 for the second pass.
__global__ void __launch_bounds__(1024) k_ce_fused(uint16_t* logits, const int32_t* targets, float* row_loss,
                                                   const float* dloss, int64_t N, int64_t V, bool bf) {  // N: denom
  uint16_t* l = logits + blockIdx.x * V;
  constexpr float L2E = 1.4426950408889634f;
  const float z = block_row_lse(l, V, bf);
  const int32_t t = targets[blockIdx.x];  // outside [0, V): reported by the deferred id check
  if (threadIdx.x == 0) row_loss[blockIdx.x] = t >= 0 && t < V ? z - ld1(l, t, bf) : 0.f;
  __syncthreads();  // the target's logit is read before the row is overwritten
  // A row whose target is -100 (ignore_index) adds no loss and gets no gradient.
  const float zl = z * L2E, scale = t == -100 ? 0.f : *dloss / static_cast<float>(N);
  for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
    const float4 x = ldv4(l, v, bf);
    const int64_t b = 4 * v;
    float4 d;
    d.x = scale * (exp2f(x.x * L2E - zl) - (b == t ? 1.f : 0.f));
    d.y = scale * (exp2f(x.y * L2E - zl) - (b + 1 == t ? 1.f : 0.f));
    d.z = scale * (exp2f(x.z * L2E - zl) - (b + 2 == t ? 1.f : 0.f));
    d.w = scale * (exp2f(x.w * L2E - zl) - (b + 3 == t ? 1.f : 0.f));
    stv4(l, v, d, false, bf);
  }
}
// dlogits (+)= dloss * (softmax - onehot) / N: D = float (accumulated when acc) or uint16_t (16-bit, written).
template <class L, class D>
__global__ void k_ce_bwd(const L* logits, const int32_t* targets, const float* lse, const float* dloss, D* dlogits,
                         bool acc, bool bf, int64_t N, int64_t V) {
  const L* l = logits + blockIdx.x * V;
  D* d = dlogits + blockIdx.x * V;
  const int32_t t = targets[blockIdx.x];
  const float z = lse[blockIdx.x], scale = t == -100 ? 0.f : *dloss / static_cast<float>(N);  // -100: ignored
  if (V % 4 == 0) {
    for (int64_t v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = ldv4(l, v, bf);
      st1(d, 4 * v, scale * (expf(x.x - z) - (4 * v == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 1, scale * (expf(x.y - z) - (4 * v + 1 == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 2, scale * (expf(x.z - z) - (4 * v + 2 == t ? 1.f : 0.f)), acc, bf);
      st1(d, 4 * v + 3, scale * (expf(x.w - z) - (4 * v + 3 == t ? 1.f : 0.f)), acc, bf);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      st1(d, v, scale * (expf(ld1(l, v, bf) - z) - (v == t ? 1.f : 0.f)), acc, bf);
  }
}
// out = sum of x[n] / denom, summed in f64 by one block (deterministic).
__global__ void k_mean(const float* x, int64_t n, float* out, int64_t denom) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) *out = static_cast<float>(s / static_cast<double>(denom));
  }
}
__global__ void k_set1(float* p, float v) { *p = v; }
// Per-block partial sums (part[blockIdx.x]), added on the host in block order: the same sum every run.
__global__ void k_sq_diff_sum(const float* a, const float* b, int64_t n, double* part) {
  float s = 0.f;
  GRID_STRIDE(i, n) {
    float d = b ? a[i] - b[i] : a[i];
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = static_cast<double>(s);
}
__global__ void k_mean_of_partials(const double* part, unsigned g, int64_t n, float* out) {
  double s = 0.0;
  for (unsigned i = 0; i < g; ++i) s += part[i];
  *out = static_cast<float>(s / static_cast<double>(n));  // n = 0: NaN, as on the CPU
}
__global__ void k_mse_bwd(const float* p, const float* t, const float* dloss, Grad dp, int64_t n) {
  float scale = 2.f * *dloss / static_cast<float>(n);
  GRID_STRIDE(i, n) dp.p[i] = (dp.acc ? dp.p[i] : 0.f) + scale * (p[i] - t[i]);
}

// ---- optimizer and helpers ----------------------------------------------------------
__global__ void k_adam(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c) {
  GRID_STRIDE(i, n) adam_elem(p[i], g[i], m[i], v[i], c);
}
// k_adam, and the updated weight rounded (bf: bfloat16, else fp16) into r16 bits / r32 values (either may be null),
// the f32 values placed by f32_copy_at(r32, slots, base, i).
__global__ void k_adam_round(float* p, const float* g, float* m, float* v, int64_t n, AdamCoeffs c, bool bf, float* r32,
                             uint16_t* r16, const int32_t* slots, int64_t base) {
  GRID_STRIDE(i, n) {
    adam_elem(p[i], g[i], m[i], v[i], c);
    const uint16_t h = to16_bits(bf, p[i]);
    if (r16) r16[i] = h;
    if (float* d = f32_copy_at(r32, slots, base, i)) *d = from16(bf, h);
  }
}
// k_adam_round four elements a thread: 16-byte loads and stores (p, g, m, v, r32 16-byte, r16 8-byte aligned,
// base % 4 == 0 so the four share a slot chunk), streamed past the caches (nothing here is read again in the
// update); the last n % 4 elements are left to k_adam_round.
__global__ void k_adam_round4(float* p, const float* g, float* m, float* v, int64_t n4, AdamCoeffs c, bool bf,
                              float* r32, uint16_t* r16, const int32_t* slots, int64_t base) {
  GRID_STRIDE(i, n4) {
    float4 pp = __ldcs(reinterpret_cast<const float4*>(p) + i), gg = __ldcs(reinterpret_cast<const float4*>(g) + i),
           mm = __ldcs(reinterpret_cast<const float4*>(m) + i), vv = __ldcs(reinterpret_cast<const float4*>(v) + i);
    adam_elem(pp.x, gg.x, mm.x, vv.x, c);
    adam_elem(pp.y, gg.y, mm.y, vv.y, c);
    adam_elem(pp.z, gg.z, mm.z, vv.z, c);
    adam_elem(pp.w, gg.w, mm.w, vv.w, c);
    __stcs(reinterpret_cast<float4*>(p) + i, pp);
    __stcs(reinterpret_cast<float4*>(m) + i, mm);
    __stcs(reinterpret_cast<float4*>(v) + i, vv);
    const ushort4 h = {to16_bits(bf, pp.x), to16_bits(bf, pp.y), to16_bits(bf, pp.z), to16_bits(bf, pp.w)};
    if (r16) reinterpret_cast<ushort4*>(r16)[i] = h;
    if (float* d = f32_copy_at(r32, slots, base, 4 * i))
      *reinterpret_cast<float4*>(d) = make_float4(from16(bf, h.x), from16(bf, h.y), from16(bf, h.z), from16(bf, h.w));
  }
}
// widen16_slots: a warp per 256-element chunk of h; chunks without a slot are skipped after one load.
__global__ void k_widen_slots(bool bf, const uint16_t* h, float* d32, int64_t n, const int32_t* slots) {
  const int64_t chunks = (n + 255) / 256, warps = (int64_t)gridDim.x * blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t k = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; k < chunks; k += warps) {
    const int32_t s = slots[k];
    if (s < 0) continue;
    for (int64_t j = lane; j < 256 && 256 * k + j < n; j += 32) d32[256 * int64_t{s} + j] = from16(bf, h[256 * k + j]);
  }
}
__global__ void k_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float mom, float damp, float wd,
                      bool nesterov, bool first) {
  GRID_STRIDE(i, n) {
    float unused = 0.f;
    sgd_elem(p[i], g[i], mom != 0.f ? buf[i] : unused, lr, mom, damp, wd, nesterov, first);
  }
}
__global__ void k_scale(float* x, float s, int64_t n) { GRID_STRIDE(i, n) x[i] *= s; }
// Sum of squares in f64 (a huge finite value cannot overflow it) and a flag for any inf/nan, one read; per-block
// partials (part[blockIdx.x]) that the host adds in block order, so the norm has the same bits every run.
__global__ void k_finite_sumsq(const float* x, int64_t n, double* part, int* bad) {
  double s = 0.0;
  bool ok = true;
  if (aligned16(x)) {
    auto add = [&](const float4& v) {
      ok = ok && isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w);
      s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    };
    const int64_t n4 = n / 4, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {  // two loads in flight a thread
      const float4 a = ld4(x, i), b = ld4(x, i + stride);
      add(a);
      add(b);
    }
    if (i < n4) add(ld4(x, i));
    for (int64_t i = n / 4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
      ok = ok && isfinite(x[i]);
      s += (double)x[i] * x[i];
    }
  } else {
    GRID_STRIDE(i, n) {
      ok = ok && isfinite(x[i]);
      s += (double)x[i] * x[i];
    }
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (!__all_sync(0xffffffffu, ok) && (threadIdx.x & 31) == 0) atomicExch(bad, 1);
  __shared__ double sh[32];
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
    part[blockIdx.x] = t;
  }
}
__global__ void k_finite(const float* x, int64_t n, int* bad) {
  GRID_STRIDE(i, n) if (!isfinite(x[i])) atomicExch(bad, 1);
}
// s rounded to 16 bits (bf: bfloat16, else fp16) into d16 bits and/or d32 values (either may be null): the one
// rounding kernel (activations, weights, the optimizer's compute copies).
template <bool V4>  // V4: s and d32 16-byte, d16 8-byte aligned, base % 4 == 0; d32 placed by f32_copy_at
__global__ void k_to16(bool bf, const float* s, uint16_t* d16, float* d32, int64_t n, const int32_t* slots,
                       int64_t base) {
  auto one = [&](int64_t i) {
    const uint16_t h = to16_bits(bf, s[i]);
    if (d16) d16[i] = h;
    if (float* d = f32_copy_at(d32, slots, base, i)) *d = from16(bf, h);
  };
  if constexpr (V4) {
    GRID_STRIDE(i, n / 4) {
      const float4 x = ld4(s, i);
      const ushort4 h = make_ushort4(to16_bits(bf, x.x), to16_bits(bf, x.y), to16_bits(bf, x.z), to16_bits(bf, x.w));
      if (d16) reinterpret_cast<ushort4*>(d16)[i] = h;
      if (float* d = f32_copy_at(d32, slots, base, 4 * i))
        *reinterpret_cast<float4*>(d) = make_float4(from16(bf, h.x), from16(bf, h.y), from16(bf, h.z), from16(bf, h.w));
    }
    for (int64_t i = n / 4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
      one(i);
  } else {
    GRID_STRIDE(i, n) one(i);
  }
}

// Row chunking of the column sums: at least 64 rows per block, at most ~128 chunks.
inline int64_t col_rows_per(int64_t N) { return std::max<int64_t>(64, (N + 127) / 128); }
// o0[c] (+)= sum_r F(r, c).x and o1[c] (+)= sum_r F(r, c).y (either may be null; acc: add, else overwrite).
template <class F>
void column_sums(F f, int64_t N, int64_t C, float* o0, float* o1, bool acc = true) {
  if (C <= 0) return;
  if (N <= 0) {
    if (!acc) {
      if (o0) ZR_CUDA(cudaMemsetAsync(o0, 0, static_cast<size_t>(C) * 4, cuda::stream()));
      if (o1) ZR_CUDA(cudaMemsetAsync(o1, 0, static_cast<size_t>(C) * 4, cuda::stream()));
    }
    return;
  }
  const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per;
  DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);  // every entry is written
  dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  k_col_partial<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(f, N, C, rows_per, part.p);
  ZR_CUDA(cudaGetLastError());
  col_final(part.p, chunks, C, o0, o1, acc);
}

class CudaBackend : public Backend {
 public:
  CudaBackend() {
    ZR_CUBLAS(cublasCreate(&h_));
    ZR_CUBLAS(cublasSetStream(h_, cuda::stream()));
    const char* a = std::getenv("ZERORUN_ATTN_ATOMICS");
    attn_atomics_ = !(a && std::strcmp(a, "0") == 0);
    const char* gs = std::getenv("ZERORUN_ATTN_GQA_SPLIT");
    attn_gqa_split_ = !(gs && std::strcmp(gs, "0") == 0);
    const char* d = std::getenv("ZERORUN_DETERMINISTIC");
    deterministic_ = d && std::strcmp(d, "1") == 0;
  }
  void set_deterministic(bool on) override { deterministic_ = on; }
  bool deterministic() const override { return deterministic_; }
  const char* name() const override { return "cuda"; }
  void set_matmul_dtype(DType dt) override {
    ZR_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, "matmul dtype must be f32, bf16 or f16");
    mm_ = dt;
  }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
            float* C) override {
    gemm_strided(ta, tb, M, N, K, alpha, A, ta ? M : K, 0, B, tb ? K : N, 0, beta, C, N, 0, 1);
  }
  void gemm_strided(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t batch) override {
    if (M == 0 || N == 0 || batch == 0) return;
    if (mm_ == DType::F32) {
      // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
      ZR_CUBLAS(cublasSgemmStridedBatched(h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                          static_cast<int>(ldb), sB, A, static_cast<int>(lda), sA, &beta, C,
                                          static_cast<int>(ldc), sC, static_cast<int>(batch)));
      return;
    }
    // Round the stored extent of each operand once, then a tensor-core product.
    auto extent = [&](bool t, int64_t rows, int64_t cols, int64_t ld, int64_t st) {
      int64_t r = t ? cols : rows, c = t ? rows : cols;
      return (st ? (batch - 1) * st : 0) + (r - 1) * ld + c;
    };
    Half a = to16(A, extent(ta, M, K, lda, sA)), b = to16(B, extent(tb, K, N, ldb, sB));
    gemm16(ta, tb, M, N, K, alpha, a.p, lda, sA, b.p, ldb, sB, beta, C, ldc, sC, batch);
  }
  void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t in, int64_t out,
                  uint16_t* x16, uint16_t* w16, uint16_t* y16, const uint16_t* b16, uint16_t* gelu16,
                  const float* residual) override {
    if (N == 0 || out == 0) return;
    ZR_CHECK(!residual || (mm_ != DType::F32 && y), "linear_fwd: the fused residual needs 16-bit products, f32 y");
    if (mm_ != DType::F32) {  // cuBLASLt, bias fused as the epilogue; x rounded into x16 when the caller keeps it
      Half xh = x16 ? Half() : to16(x, N * in), wh = w16 ? Half() : to16(w, out * in);
      if (x16 && x) round16(x, x16, N * in);    // x null: x16 already holds the 16-bit input
      if (w16 && w) round16(w, w16, out * in);  // w null: so does w16 the weight
      profile::Scope ps(".. cublasLt linear fwd");
      const void *xp = x16 ? x16 : xh.p, *wp = w16 ? w16 : wh.p;
      if (y16) {  // 16-bit output: cuBLASLt's bias epilogue then takes a 16-bit bias
        Half bh = b && !b16 ? to16(b, out) : Half();
        const void* bp = b16 ? b16 : bh.p;
        if (gelu16) {  // y16 keeps GELU's input, gelu16 gets its output
          Epilogue e{bp ? Epilogue::GeluAuxBias : Epilogue::GeluAux, const_cast<void*>(bp), mm_, y16, out};
          lt().run(mm_, false, true, N, out, in, xp, in, wp, in, 0.f, gelu16, mm_, out, e);
        } else {
          lt().run(mm_, false, true, N, out, in, xp, in, wp, in, 0.f, y16, mm_, out, bp, mm_);
        }
      } else {
        ZR_CHECK(!gelu16, "linear_fwd: the fused GELU needs a 16-bit output");
        Epilogue e;  // y = x w^T (+ residual as C with beta 1) (+ b)
        if (b) e.kind = Epilogue::Bias, e.vec = const_cast<float*>(b), e.vdt = DType::F32;
        e.addend = residual;
        lt().run(mm_, false, true, N, out, in, xp, in, wp, in, residual ? 1.f : 0.f, y, DType::F32, out, e);
      }
      return;
    }
    ZR_CHECK(x && w && y && !y16 && !gelu16, "16-bit linear storage needs a 16-bit matmul dtype");
    gemm(false, true, N, out, in, 1.f, x, w, 0.f, y);
    if (b) LAUNCH(k_bias_add, N * out, y, b, N * out, out);
  }
  void linear_bwd(const float* x, const float* w, const float* dy, Grad dx, Grad dwg, Grad dbg, int64_t N, int64_t in,
                  int64_t out, const uint16_t* x16, const uint16_t* w16, const uint16_t* dy16,
                  const uint16_t* dgelu16) override {
    const float dx_beta = dx.acc ? 1.f : 0.f, dw_beta = dwg.acc ? 1.f : 0.f;
    float *dw = dwg.p, *db = dbg.p;
    const bool db_acc = dbg.acc;
    ZR_CHECK(!dx.h || mm_ != DType::F32, "16-bit input gradients need a 16-bit matmul dtype");
    ZR_CHECK(!dgelu16 || (dx.h && mm_ != DType::F32), "linear_bwd: the fused GELU gradient needs a 16-bit dx");
    if (mm_ == DType::F32) {
      if (dx) gemm(false, false, N, in, out, 1.f, dy, w, dx_beta, dx.p);
      if (dw) gemm(true, false, out, in, N, 1.f, dy, x, dw_beta, dw);
    } else {  // dy is rounded once for both products (summing its columns for db in the same pass)
      Half dyh = dy ? Half(static_cast<size_t>(N * out), false) : Half();
      if (!dy) {  // 16-bit gradient: used as it is, nothing to round
        if (db) bias_grad16(dy16, N, out, db, db_acc);
        db = nullptr;
      } else {
        if (db && N > 0) {
          round16_colsum(dy, dyh.p, N, out, db, db_acc);
          db = nullptr;
        } else {
          round16(dy, dyh.p, N * out);
        }
        dy16 = dyh.p;
      }
      if (dx) {
        Half wh = w16 ? Half() : to16(w, out * in);
        profile::Scope ps(".. cublasLt linear dx");
        if (dgelu16)  // the gradient of GELU's input: (dy w) * gelu'(dgelu16) in the epilogue
          lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, 0.f, dx.h, mm_, in,
                   Epilogue{Epilogue::DGelu, nullptr, mm_, const_cast<uint16_t*>(dgelu16), in});
        else if (dx.h)  // 16-bit gradient: written, never accumulated
          lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, 0.f, dx.h, mm_, in, nullptr);
        else
          lt().run(mm_, false, false, N, in, out, dy16, out, w16 ? w16 : wh.p, in, dx_beta, dx.p, in, nullptr);
      }
      if (dw) {
        Half xh = x16 ? Half() : to16(x, N * in);
        profile::Scope ps(".. cublasLt linear dw");
        lt().run(mm_, true, false, out, in, N, dy16, out, x16 ? x16 : xh.p, in, dw_beta, dw, in, nullptr);
      }
    }
    if (db) {
      profile::Scope ps(".. bias grad");
      column_sums(ColOf{dy}, N, out, db, nullptr, db_acc);
    }
  }
  DType matmul_dtype() const override { return mm_; }
  bool activations16() const override { return mm_ != DType::F32; }
  bool fuses_gelu() const override { return mm_ != DType::F32; }
  bool fuses_residual() const override { return mm_ != DType::F32; }
  bool attention16(const AttnDims& d) const override { return tensor_core_attention(d); }
  void act_fwd16(Act act, Src x, Dst y, int64_t n) override {
    const bool bf = mm_ == DType::BF16;
    switch (act) {
      case Act::Gelu:
        return act_fwd_any<0>(x, y, n, bf);
      case Act::Relu:
        return act_fwd_any<1>(x, y, n, bf);
      default:
        return act_fwd_any<2>(x, y, n, bf);
    }
  }
  void widen16(const uint16_t* h, float* f, int64_t n) override {
    map_mixed(Ident{}, h, kNoB, f, n, false, mm_ == DType::BF16);
  }
  void act_bwd16(Act act, Src x, Src dy, Grad dx, int64_t n) override {
    const bool bf = mm_ == DType::BF16;
    switch (act) {
      case Act::Gelu:
        return act_bwd_src<0>(x, dy, dx, n, bf);
      case Act::Relu:
        return act_bwd_src<1>(x, dy, dx, n, bf);
      default:
        return act_bwd_src<2>(x, dy, dx, n, bf);
    }
  }
  void layernorm_fwd16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps) override {
    if (!N) return;
    ln_fwd<uint16_t>(x, w, b, y, mean, rstd, N, C, eps, mm_ == DType::BF16);
  }
  void add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) override {
    if (nb == n)
      elementwise<false>(Plus{}, a, b, y, n);
    else
      LAUNCH(k_add, n, a, b, y, n, nb);
  }
  void add_bwd(const float* dy, Grad da, Grad db, int64_t n, int64_t nb) override {
    if (da) pass_grad(dy, da, n);
    if (db) {
      if (nb == n)
        pass_grad(dy, db, n);
      else {
        ZR_CHECK(!db.h, "a broadcast add's gradient is f32");
        column_sums(ColOf{dy}, n / nb, nb, db.p, nullptr, db.acc);
      }
    }
  }
  void swiglu_fwd(Src g, Src u, Dst y, int64_t n) override { pair_fwd(SwiGluF{}, g, u, y, n, mm_ == DType::BF16); }
  void swiglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override {
    pair_bwd(SwiGluF{}, g, u, dy, dg, du, n, mm_ == DType::BF16);
  }
  void geglu_fwd(Src g, Src u, Dst y, int64_t n) override { pair_fwd(GeGluF{}, g, u, y, n, mm_ == DType::BF16); }
  void geglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) override {
    pair_bwd(GeGluF{}, g, u, dy, dg, du, n, mm_ == DType::BF16);
  }
  void unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n) override {
    qk::unary_fwd(op, a, x, y, n, cuda::stream());
  }
  void dropout(const rng::Dropout& d, const float* x, Grad y, int64_t n) override {
    ZR_CHECK(!y.h, "dropout takes f32 tensors");
    if (y.p) qk::dropout(d, x, y.p, y.acc, n, cuda::stream());
  }
  void unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, Grad dx, int64_t n) override {
    ZR_CHECK(!dx.h, "unary ops take f32 gradients");
    if (dx.p) qk::unary_bwd(op, a, x, dy, dx.p, dx.acc, n, cuda::stream());
  }
  void zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) override {
    qk::zero_rows(ids, value, x, N, C, cuda::stream());
  }
  void qk_norm_fwd(const float* x, const float* wq, const float* wk, float* y, float* rstd, int64_t N, int64_t H,
                   int64_t K, int64_t D, bool full, float eps) override {
    qk::norm_fwd(x, wq, wk, y, rstd, N, H, K, D, full, eps, cuda::stream());
  }
  void qk_norm_bwd(const float* x, const float* wq, const float* wk, const float* rstd, const float* dy, Grad dx,
                   float* dwq, float* dwk, int64_t N, int64_t H, int64_t K, int64_t D, bool full) override {
    ZR_CHECK(!dx.h, "qk_norm takes an f32 gradient");
    qk::norm_bwd(x, wq, wk, rstd, dy, dx.p, dx.acc, dwq, dwk, N, H, K, D, full, cuda::stream());
  }
  void mul_fwd(Src a, Src b, Dst y, int64_t n) override { pair_fwd(MulF{}, a, b, y, n, mm_ == DType::BF16); }
  void mul_bwd(Src a, Src b, Src dy, Grad da, Grad db, int64_t n) override {
    pair_bwd(MulF{}, a, b, dy, da, db, n, mm_ == DType::BF16);
  }
  void act_fwd(Act act, const float* x, float* y, int64_t n) override {
    switch (act) {
      case Act::Gelu:
        return elementwise<false>(ActF<0>{}, x, nullptr, y, n);
      case Act::Relu:
        return elementwise<false>(ActF<1>{}, x, nullptr, y, n);
      default:
        return elementwise<false>(ActF<2>{}, x, nullptr, y, n);
    }
  }
  void act_bwd(Act act, const float* x, const float* dy, Grad dx, int64_t n) override {
    if (dx.h) return act_bwd16(act, Src{x, nullptr}, Src{dy, nullptr}, dx, n);  // f32 below: the float4 maps
    switch (act) {
      case Act::Gelu:
        return dx.acc ? elementwise<true>(ActB<0>{}, x, dy, dx.p, n) : elementwise<false>(ActBW<0>{}, x, dy, dx.p, n);
      case Act::Relu:
        return dx.acc ? elementwise<true>(ActB<1>{}, x, dy, dx.p, n) : elementwise<false>(ActBW<1>{}, x, dy, dx.p, n);
      default:
        return dx.acc ? elementwise<true>(ActB<2>{}, x, dy, dx.p, n) : elementwise<false>(ActBW<2>{}, x, dy, dx.p, n);
    }
  }
  void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                     int64_t C, float eps) override {
    if (!N) return;
    ln_fwd<float>(x, w, b, y, mean, rstd, N, C, eps, false);
  }
  void layernorm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, Grad dx,
                     float* dw, float* db, int64_t N, int64_t C) override {
    norm_bwd(x, w, mean, rstd, dy, dx, dw, db, N, C, false);
  }
  void layernorm_bwd16(const float* x, const float* w, const float* mean, const float* rstd, const uint16_t* dy,
                       Grad dx, float* dw, float* db, int64_t N, int64_t C) override {
    norm_bwd(x, w, mean, rstd, dy, dx, dw, db, N, C, mm_ == DType::BF16);
  }
  // The layernorm backward (mean null: rmsnorm's, no db) for an f32 or 16-bit dy: the one-pass kernel where it
  // fits, else the dx kernel and the column sums.
  template <class D>
  void norm_bwd(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, Grad dx, float* dw,
                float* db, int64_t N, int64_t C, bool bf) {
    if (!N) return;
    ZR_CHECK(!dx.h, mean ? "a layernorm's" : "an rmsnorm's", " input gradient is f32");
    if (ln_bwd_fused(x, w, mean, rstd, dy, dx, dw, db, N, C, bf)) return;
    if (dx) k_ln_bwd_dx<D><<<rows_grid(N), kTpb, 0, cuda::stream()>>>(x, w, mean, rstd, dy, dx.p, dx.acc, N, C, bf);
    if (dw || db) column_sums(LnWB<D>{x, mean, rstd, dy, bf}, N, C, dw, db);
    ZR_CUDA(cudaGetLastError());
  }
  // rmsnorm: the layernorm kernels without mean (no centring) and bias.
  void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C, float eps) override {
    if (N) ln_fwd<float>(x, w, nullptr, y, nullptr, rstd, N, C, eps, false);
  }
  void rmsnorm_fwd16(const float* x, const float* w, uint16_t* y, float* rstd, int64_t N, int64_t C,
                     float eps) override {
    if (N) ln_fwd<uint16_t>(x, w, nullptr, y, nullptr, rstd, N, C, eps, mm_ == DType::BF16);
  }
  void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, Grad dx, float* dw, int64_t N,
                   int64_t C) override {
    norm_bwd(x, w, nullptr, rstd, dy, dx, dw, nullptr, N, C, false);
  }
  void rmsnorm_bwd16(const float* x, const float* w, const float* rstd, const uint16_t* dy, Grad dx, float* dw,
                     int64_t N, int64_t C) override {
    norm_bwd(x, w, nullptr, rstd, dy, dx, dw, nullptr, N, C, mm_ == DType::BF16);
  }
  // Grouped-query heads in place: query heads g * rep + r (r fixed, g = 0 .. K-1) over key/value heads g are one
  // strided batch of K products per r (K = H: one batch of H, as multi-head attention).
  void attention_fwd(const float* qkv, float* out, float* probs, const AttnDims& d) override {
    const int64_t T = d.T, D = d.D, W = d.width(), O = d.out_width(), TT = T * T, H = d.H, K = d.K, rep = d.rep();
    for (int64_t b = 0; b < d.B; ++b) {
      const float* x = qkv + b * T * W;
      float* P = probs + b * H * TT;
      for (int64_t r = 0; r < rep; ++r)
        gemm_strided(false, true, T, T, D, d.scale, x + r * D, W, rep * D, x + H * D, W, D, 0.f, P + r * TT, T,
                     rep * TT, K);
    }
    k_causal_softmax<<<rows_grid(d.B * H * T), kTpb, 0, cuda::stream()>>>(probs, d.B * H * T, T, d.window, d.softcap,
                                                                          d.pos, H);
    ZR_CUDA(cudaGetLastError());
    DevBuf<float> Pd = d.drop.threshold ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
    for (int64_t b = 0; b < d.B; ++b) {
      const float* x = qkv + b * T * W;
      const float* P = dropped(probs + b * H * TT, Pd.p, b, d);
      for (int64_t r = 0; r < rep; ++r)
        gemm_strided(false, false, T, D, T, 1.f, P + r * TT, T, rep * TT, x + (H + K) * D, W, D, 0.f,
                     out + b * T * O + r * D, O, rep * D, K);
    }
  }
  // Row b's probabilities [H, T, T] after the dropout of d.drop (written to scratch), or P itself without one. Their
  // linear index is the mask's counter (cpu::AttnDims::drop); with dP for P, the gradient through the dropout.
  const float* dropped(const float* P, float* scratch, int64_t b, const AttnDims& d) {
    if (d.drop.threshold == 0) return P;
    rng::Dropout m = d.drop;
    m.counter0 += static_cast<uint64_t>(b * d.H * d.T * d.T);
    qk::dropout(m, P, scratch, false, d.H * d.T * d.T, cuda::stream());
    return scratch;
  }
  void attention_bwd(const float* qkv, const float* probs, const float* dout, Grad dqkv_g, const AttnDims& d) override {
    const int64_t T = d.T, D = d.D, W = d.width(), O = d.out_width(), TT = T * T, H = d.H, K = d.K, rep = d.rep();
    float* dqkv = zeroed_unless_acc(dqkv_g, d.B * T * W);  // the products below accumulate
    DevBuf<float> dP(static_cast<size_t>(H * TT));
    DevBuf<float> S = d.softcap > 0.f ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
    DevBuf<float> Pd = d.drop.threshold ? DevBuf<float>(static_cast<size_t>(H * TT)) : DevBuf<float>();
    for (int64_t b = 0; b < d.B; ++b) {
      const float* x = qkv + b * T * W;
      const float* P = probs + b * H * TT;
      const float* Pv = dropped(P, Pd.p, b, d);  // the probabilities that weighed V
      const float* dO = dout + b * T * O;
      float* dx = dqkv + b * T * W;
      for (int64_t r = 0; r < rep; ++r) {
        gemm_strided(false, true, T, T, D, 1.f, dO + r * D, O, rep * D, x + (H + K) * D, W, D, 0.f, dP.p + r * TT, T,
                     rep * TT, K);  // dP = dO V^T
        gemm_strided(true, false, T, D, T, 1.f, Pv + r * TT, T, rep * TT, dO + r * D, O, rep * D, 1.f, dx + (H + K) * D,
                     W, D, K);  // dV += P^T dO
        if (S.p)                // the scaled scores again, for the soft-cap's derivative
          gemm_strided(false, true, T, T, D, d.scale, x + r * D, W, rep * D, x + H * D, W, D, 0.f, S.p + r * TT, T,
                       rep * TT, K);
      }
      if (d.drop.threshold) dropped(dP.p, dP.p, b, d);  // in place: the gradient of the undropped probabilities
      k_softmax_bwd<<<rows_grid(H * T), kTpb, 0, cuda::stream()>>>(P, dP.p, S.p, H * T, T, d.scale, d.softcap);
      ZR_CUDA(cudaGetLastError());
      for (int64_t r = 0; r < rep; ++r) {
        gemm_strided(false, false, T, D, T, 1.f, dP.p + r * TT, T, rep * TT, x + H * D, W, D, 1.f, dx + r * D, W,
                     rep * D, K);  // dQ += dS K
        gemm_strided(true, false, T, D, T, 1.f, dP.p + r * TT, T, rep * TT, x + r * D, W, rep * D, 1.f, dx + H * D, W,
                     D, K);  // dK += dS^T Q
      }
    }
  }
  void attention_cached(const float* qkv, float* kc, float* vc, float* out, const AttnDims& d, int64_t len,
                        int64_t cap) override {
    cached::forward(qkv, kc, vc, out, d, len, cap, cuda::stream());
  }
  void rope_fwd(Src qkv, Dst out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override {
    rope::forward({qkv.p, qkv.h}, {out.p, out.h}, mm_ == DType::BF16, B, T, H, K, D, f, repeat, pos, n_pos,
                  cuda::stream());
  }
  void rope_bwd(Src dout, Grad dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
                bool repeat, const int32_t* pos, int64_t n_pos) override {
    if (dqkv)
      rope::backward({dout.p, dout.h}, {dqkv.p, dqkv.h}, dqkv.acc, mm_ == DType::BF16, B, T, H, K, D, f, repeat, pos,
                     n_pos, cuda::stream());
  }
  // Dropout of the probabilities runs on the materialised path below.
  bool has_flash_attention(const AttnDims& d) const override { return d.drop.threshold == 0 && flash::supported(d); }
  void flash_attention_fwd(Src qkv, Dst out, float* lse, const AttnDims& d) override {
    const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width();
    if (tensor_core_attention(d)) {  // 16-bit operands: an f32 qkv is rounded first
      Half q16 = qkv.h ? Half() : to16(qkv.p, n3);
      flash::tc_forward(mm_ == DType::BF16, qkv.h ? qkv.h : q16.p, out.p, out.h, lse, d);
      return;
    }
    DevBuf<float> qf = widened(qkv, n3), of = out.h ? DevBuf<float>(static_cast<size_t>(n), false) : DevBuf<float>();
    flash::forward(qkv.h ? qf.p : qkv.p, out.h ? of.p : out.p, lse, d);
    if (out.h) round16(of.p, out.h, n);
  }
  void flash_attention_bwd(Src qkv, Src out, const float* lse, Src dout, Grad dqkv, const AttnDims& d) override {
    const int64_t n3 = d.B * d.T * d.width(), n = d.B * d.T * d.out_width();
    DevBuf<float> delta(static_cast<size_t>(d.B * d.H * d.T), false);
    if (tensor_core_attention(d)) {
      Half q16 = qkv.h ? Half() : to16(qkv.p, n3), d16 = dout.h ? Half() : to16(dout.p, n);
      const bool atomics = attn_atomics_ && !deterministic_;
      // dQ's accumulator (then dK's and dV's where grouped-query heads are split: B*T*(H + 2K)*D floats).
      const bool split = atomics && attn_gqa_split_ && d.K < d.H;
      DevBuf<float> dq_acc = atomics ? DevBuf<float>(static_cast<size_t>(split ? n3 : n), false) : DevBuf<float>();
      flash::tc_backward(mm_ == DType::BF16, qkv.h ? qkv.h : q16.p, out.p, out.h, lse, dout.h ? dout.h : d16.p, dqkv.p,
                         dqkv.h, dqkv.acc, delta.p, dq_acc.p, d, 0, split);
      return;
    }
    DevBuf<float> qf = widened(qkv, n3), of = widened(out, n), df = widened(dout, n);
    float* dp = dqkv.h ? nullptr : zeroed_unless_acc(dqkv, n3);
    DevBuf<float> d32 = dqkv.h ? DevBuf<float>(static_cast<size_t>(n3)) : DevBuf<float>();
    flash::backward(qkv.h ? qf.p : qkv.p, out.h ? of.p : out.p, lse, dout.h ? df.p : dout.p, dqkv.h ? d32.p : dp,
                    delta.p, d);
    if (dqkv.h) round16(d32.p, dqkv.h, n3);
  }
  bool ids_in_range(const int32_t* ids, int64_t n, int64_t V) override {
    DevBuf<int> bad(1);
    LAUNCH(k_ids_check, n, ids, n, V, bad.p, 1);
    int h = 0;
    cuda::fetch(&h, bad.p, sizeof h);
    return h == 0;
  }
  // Queued without a wait: the first failing check since the last read raises its message at the next
  // get_scalar. A message's code stays the same for the run, so a CUDA graph replaying the check stays right.
  void check_ids_deferred(const int32_t* ids, int64_t n, int64_t V, const std::string& message,
                          int32_t ignore) override {
    if (!n) return;
    if (!ids_flag_) {
      ids_flag_ = static_cast<int*>(cuda::device_alloc(sizeof(int), dev_of_backend()));
      ZR_CUDA(cudaMemsetAsync(ids_flag_, 0, sizeof(int), cuda::stream()));
      ZR_CUDA(cudaMallocHost(&ids_flag_host_, sizeof(int)));
      *ids_flag_host_ = 0;
    }
    if (++ids_unread_ >= 4096) raise_deferred(true);  // a caller that never reads a value: check now
    auto [it, fresh] = ids_codes_.try_emplace(message, static_cast<int>(ids_messages_.size()) + 1);
    if (fresh) ids_messages_.push_back(message);
    LAUNCH(k_ids_check, n, ids, n, V, ids_flag_, it->second, ignore);
  }
  void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t V) override {
    LAUNCH(k_emb_fwd, N * C, ids, table, out, N, C, V);
  }
  void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) override {
    if (!deterministic_) {
      LAUNCH(k_emb_bwd, N * C, ids, dout, dtable, N, C, V);
      return;
    }
    if (N <= 0) return;
    ZR_CHECK(N <= INT32_MAX && V < INT32_MAX, "embedding backward: ", N, " positions / ", V, " ids exceed int32");
    DevBuf<uint32_t> keys(static_cast<size_t>(2 * N), false);
    DevBuf<int32_t> pos(static_cast<size_t>(2 * N), false);
    LAUNCH(k_emb_keys, N, ids, N, V, keys.p, pos.p);
    int bits = 1;
    while ((int64_t{1} << bits) <= V) ++bits;  // the keys are 0..V
    size_t temp = 0;
    ZR_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys.p, keys.p + N, pos.p, pos.p + N, static_cast<int>(N), 0,
                                            bits, cuda::stream()));
    DevBuf<unsigned char> scratch(std::max<size_t>(temp, 1), false);
    ZR_CUDA(cub::DeviceRadixSort::SortPairs(scratch.p, temp, keys.p, keys.p + N, pos.p, pos.p + N, static_cast<int>(N),
                                            0, bits, cuda::stream()));
    const int64_t chunks = (N + kEmbChunk - 1) / kEmbChunk;
    DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(chunks, 65535));
    const unsigned threads =
        static_cast<unsigned>(std::clamp<int64_t>((C % 4 == 0 ? C / 4 : C + 31) / 32 * 32, 32, 256));
    if (C % 4 == 0 && aligned16(dout) && aligned16(dtable)) {
      k_emb_bwd_chunks<4><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, pos.p + N, dout, dtable, part.p, N, C, V);
      k_emb_bwd_spans<4><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, part.p, dtable, N, C, V);
    } else {
      k_emb_bwd_chunks<1><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, pos.p + N, dout, dtable, part.p, N, C, V);
      k_emb_bwd_spans<1><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, part.p, dtable, N, C, V);
    }
    ZR_CUDA(cudaGetLastError());
  }
  void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) override {
    LAUNCH(k_pos_fwd, B * T * C, table, out, B, T, C);
  }
  void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) override {
    LAUNCH(k_pos_bwd, T * C, dout, dtable, B, T, C);
  }
  // denom (0: N) divides the rows' loss sum and the gradient instead of N (a chunk of a larger batch).
  void cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss,
                         int64_t denom = 0) override {
    ce_fwd(logits, targets, lse, N, V, loss, denom);
  }
  void cross_entropy_fwd16(const uint16_t* logits, const int32_t* targets, float* lse, int64_t N, int64_t V,
                           float* loss, int64_t denom = 0) override {
    ce_fwd(logits, targets, lse, N, V, loss, denom);
  }
  void cross_entropy_bwd16(const uint16_t* logits, const int32_t* targets, const float* lse, const float* dloss,
                           Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) override {
    ce_bwd(logits, targets, lse, dloss, dlogits, N, V, denom);
  }
  bool fuses_cross_entropy(int64_t V) const override { return mm_ != DType::F32 && V % 4 == 0; }
  void cross_entropy_fused16(uint16_t* logits, const int32_t* targets, int64_t N, int64_t V, const float* dloss,
                             float* loss, int64_t denom = 0) override {
    const int64_t D = denom > 0 ? denom : N;
    ZR_CHECK(fuses_cross_entropy(V) && reinterpret_cast<uintptr_t>(logits) % 8 == 0,
             "fused cross-entropy needs 16-bit logits, 8-byte aligned, V % 4 == 0");
    if (!N) return set_scalar(loss, 0.f);
    DevBuf<float> rows(static_cast<size_t>(N), false);
    k_ce_fused<<<static_cast<unsigned>(N), 1024, 0, cuda::stream()>>>(logits, targets, rows.p, dloss, D, V,
                                                                      mm_ == DType::BF16);
    ZR_CUDA(cudaGetLastError());
    k_mean<<<1, 1024, 0, cuda::stream()>>>(rows.p, N, loss, D);
    ZR_CUDA(cudaGetLastError());
  }
  template <class L>  // the mean loss stays on the device: no wait for the forward
  void ce_fwd(const L* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, float* loss, int64_t denom) {
    if (!N) return set_scalar(loss, 0.f);
    DevBuf<float> rows(static_cast<size_t>(N), false);
    k_ce_fwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, rows.p, lse, V,
                                                                    mm_ == DType::BF16);
    ZR_CUDA(cudaGetLastError());
    k_mean<<<1, 1024, 0, cuda::stream()>>>(rows.p, N, loss, denom > 0 ? denom : N);
    ZR_CUDA(cudaGetLastError());
  }
  void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                         Grad dlogits, int64_t N, int64_t V, int64_t denom = 0) override {
    ce_bwd(logits, targets, lse, dloss, dlogits, N, V, denom);
  }
  template <class L>
  void ce_bwd(const L* logits, const int32_t* targets, const float* lse, const float* dloss, Grad dlogits, int64_t N,
              int64_t V, int64_t denom) {
    if (!N) return;
    const int64_t D = denom > 0 ? denom : N;
    const bool bf = mm_ == DType::BF16;
    if (dlogits.h)
      k_ce_bwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, lse, dloss, dlogits.h, false, bf,
                                                                      D, V);
    else
      k_ce_bwd<<<static_cast<unsigned>(N), kTpb, 0, cuda::stream()>>>(logits, targets, lse, dloss, dlogits.p,
                                                                      dlogits.acc, bf, D, V);
    ZR_CUDA(cudaGetLastError());
  }
  void mse_fwd(const float* pred, const float* target, int64_t n, float* loss) override {
    // On the device, so a CUDA graph can capture it: the blocks' partials, then one thread adds them in block
    // order (the same sum every run, as the host's sum of the partials would be).
    const unsigned g = n ? std::min<unsigned>(grid_for(n), 1024) : 1;
    DevBuf<double> acc(g, !n);
    if (n) k_sq_diff_sum<<<g, kTpb, 0, cuda::stream()>>>(pred, target, n, acc.p);
    k_mean_of_partials<<<1, 1, 0, cuda::stream()>>>(acc.p, g, n, loss);
    ZR_CUDA(cudaGetLastError());
  }
  void mse_bwd(const float* pred, const float* target, const float* dloss, Grad dpred, int64_t n) override {
    LAUNCH(k_mse_bwd, n, pred, target, dloss, dpred, n);
  }
  void adam_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 float wd, bool adamw, bool bias_correction, int64_t step) override {
    LAUNCH(k_adam, n, p, g, m, v, n, adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step));
  }
  void adam_step_rounded(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float wd, bool adamw, bool bias_correction, int64_t step, DType dt, float* r32,
                         uint16_t* r16, const int32_t* slots, int64_t base) override {
    if (!r32 && !r16) return adam_step(p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
    ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "rounded AdamW copies need bf16 or f16");
    const AdamCoeffs c = adam_coeffs(lr, beta1, beta2, eps, wd, adamw, bias_correction, step);
    const bool bf = dt == DType::BF16;
    int64_t done = 0;
    if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!r32 || aligned16(r32)) &&
        reinterpret_cast<uintptr_t>(r16) % 8 == 0 && base % 4 == 0) {
      const int64_t n4 = n / 4;
      LAUNCH(k_adam_round4, n4, p, g, m, v, n4, c, bf, r32, r16, slots, base);
      done = n4 * 4;
    }
    if (n > done)  // with slots, r32 is the compact buffer's start and base moves instead
      LAUNCH(k_adam_round, n - done, p + done, g + done, m + done, v + done, n - done, c, bf,
             r32 && !slots ? r32 + done : r32, r16 ? r16 + done : nullptr, slots, base + done);
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening, float wd,
                bool nesterov, bool first_step) override {
    LAUNCH(k_sgd, n, p, g, buf, n, lr, momentum, dampening, wd, nesterov, first_step);
  }
  void scale_inplace(float* x, float s, int64_t n) override { LAUNCH(k_scale, n, x, s, n); }
  void accumulate(float* acc, const float* x, int64_t n) override { elementwise<true>(AccA{}, x, nullptr, acc, n); }
  double sum_squares(const float* x, int64_t n) override { return sum_sq(x, nullptr, n); }
  double finite_sum_squares(const float* x, int64_t n, bool* finite) override {
    *finite = true;
    if (n <= 0) return 0.0;
    const unsigned g = std::min<unsigned>(grid_for((n + 3) / 4), 1024);
    DevBuf<double> acc(g + 1);  // the blocks' partials, then the inf/nan flag (an int): one zero-fill, one copy back
    int* bad = reinterpret_cast<int*>(acc.p + g);
    k_finite_sumsq<<<g, kTpb, 0, cuda::stream()>>>(x, n, acc.p, bad);
    ZR_CUDA(cudaGetLastError());
    std::vector<double> h(g + 1);
    cuda::fetch(h.data(), acc.p, h.size() * sizeof(double));
    int b = 0;
    std::memcpy(&b, &h[g], sizeof b);
    *finite = b == 0;
    double sum = 0.0;
    for (unsigned i = 0; i < g; ++i) sum += h[i];
    return *finite ? sum : 0.0;
  }
  bool all_finite(const float* x, int64_t n) override {
    DevBuf<int> bad(1);
    LAUNCH(k_finite, n, x, n, bad.p);
    int h = 0;
    cuda::fetch(&h, bad.p, sizeof h);
    return h == 0;
  }
  void round_to(DType dt, const float* src, float* dst, int64_t n) override {
    if (dt == DType::F32) {
      if (src != dst)
        ZR_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
      return;
    }
    round_any(dt == DType::BF16, src, nullptr, dst, n);
  }
  void round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n, const int32_t* slots,
                  int64_t base) override {
    ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "round_to16 needs bf16 or f16");
    round_any(dt == DType::BF16, src, dst, dst32, n, slots, base);
  }
  void set_scalar(float* p, float v) override {  // a kernel argument: queued, no wait
    k_set1<<<1, 1, 0, cuda::stream()>>>(p, v);
    ZR_CUDA(cudaGetLastError());
  }
  float get_scalar(const float* p) override {
    float v = 0.f;
    if (ids_flag_)  // the deferred checks' flag comes back with the value, in the same wait
      ZR_CUDA(cudaMemcpyAsync(ids_flag_host_, ids_flag_, sizeof(int), cudaMemcpyDeviceToHost, cuda::stream()));
    cuda::fetch(&v, p, 4);
    raise_deferred(false);
    return v;
  }

 private:
  // dst (+)= src: a plain copy when overwriting.
  void pass_grad(const float* src, Grad dst, int64_t n) {
    if (dst.h)
      round16(src, dst.h, n);
    else if (dst.acc)
      elementwise<true>(AccA{}, src, nullptr, dst.p, n);
    else if (n > 0)
      ZR_CUDA(cudaMemcpyAsync(dst.p, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
  }
  // For kernels that only accumulate: zero an overwrite target first.
  float* zeroed_unless_acc(Grad g, int64_t n) {
    if (g.p && !g.acc && n > 0) ZR_CUDA(cudaMemsetAsync(g.p, 0, static_cast<size_t>(n) * 4, cuda::stream()));
    return g.p;
  }
  // d = 16-bit dy and db[c] (+)= sum_r dy[r, c], one read of dy (acc false: db overwritten).
  void round16_colsum(const float* dy, uint16_t* d, int64_t N, int64_t C, float* db, bool acc) {
    profile::Scope ps(".. to16 + bias grad");
    const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per;
    if (C % 4 == 0 && aligned16(dy) && reinterpret_cast<uintptr_t>(d) % 8 == 0) {  // one kernel, its own final sum
      const int64_t cblocks = (C + 127) / 128;
      DevBuf<float> part(static_cast<size_t>(chunks * C), false);
      dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(chunks));
      k_to16_colsum4<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(mm_ == DType::BF16, dy, d, N, C, rows_per, part.p,
                                                                      done_counters(cblocks), db, acc);
      ZR_CUDA(cudaGetLastError());
      return;
    }
    DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);
    dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    k_to16_colsum<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(mm_ == DType::BF16, dy, d, N, C, rows_per, part.p);
    ZR_CUDA(cudaGetLastError());
    col_final(part.p, chunks, C, db, nullptr, acc);
  }
  // The one-pass layernorm backward where C fits (and dw, db both wanted); false: not taken.
  template <class D>
  bool ln_bwd_fused(const float* x, const float* w, const float* mean, const float* rstd, const D* dy, Grad dx,
                    float* dw, float* db, int64_t N, int64_t C, bool bf) {
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
  // db (+)= the column sums of the 16-bit dy [N, C]: one kernel (its last blocks add the chunks' partials).
  void bias_grad16(const uint16_t* dy, int64_t N, int64_t C, float* db, bool acc) {
    const bool bf = mm_ == DType::BF16;
    if (C % 8 != 0 || reinterpret_cast<uintptr_t>(dy) % 16 != 0 || N <= 0)
      return column_sums(ColOf16{dy, bf}, N, C, db, nullptr, acc);
    const int64_t rows_per = col_rows_per(N), chunks = (N + rows_per - 1) / rows_per, cblocks = (C + 255) / 256;
    DevBuf<float> part(static_cast<size_t>(chunks * C), false);
    dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(chunks));
    k_col16_sum<<<grid, dim3(32, kColRows), 0, cuda::stream()>>>(dy, bf, N, C, rows_per, part.p, done_counters(cblocks),
                                                                 db, acc);
    ZR_CUDA(cudaGetLastError());
  }
  // At least n zeroed completion counters for the one-kernel column sums (each kernel re-zeroes those it used).
  unsigned* done_counters(int64_t n) {
    if (done_.bytes < static_cast<size_t>(n) * sizeof(unsigned))
      done_ = DevBuf<unsigned>(static_cast<size_t>(std::max<int64_t>(n, 1024)));  // zeroed
    return done_.p;
  }
  // An f32 copy of a 16-bit input (empty when it is f32 already).
  DevBuf<float> widened(Src x, int64_t n) {
    if (!x.h) return {};
    DevBuf<float> f(static_cast<size_t>(n), false);
    widen16(x.h, f.p, n);
    return f;
  }
  // 16-bit runs use the tensor-core kernels where the head size allows.
  bool tensor_core_attention(const AttnDims& d) const { return mm_ != DType::F32 && flash::tc_supported(d); }
  double sum_sq(const float* a, const float* b, int64_t n) {
    if (!n) return 0.0;
    const unsigned g = std::min<unsigned>(grid_for(n), 1024);
    DevBuf<double> acc(g, false);  // every block writes its partial
    k_sq_diff_sum<<<g, kTpb, 0, cuda::stream()>>>(a, b, n, acc.p);
    ZR_CUDA(cudaGetLastError());
    std::vector<double> h(g);
    cuda::fetch(h.data(), acc.p, h.size() * sizeof(double));
    double sum = 0.0;
    for (double v : h) sum += v;
    return sum;
  }
  using Half = DevBuf<uint16_t>;  // bf16 or f16 bits, per mm_
  Half to16(const float* x, int64_t n) const {
    Half h(static_cast<size_t>(n), false);
    round16(x, h.p, n);
    return h;
  }
  void round16(const float* x, uint16_t* d, int64_t n) const {
    profile::Scope ps(".. to16");
    round_any(mm_ == DType::BF16, x, d, nullptr, n);
  }
  static void round_any(bool bf, const float* x, uint16_t* d16, float* d32, int64_t n, const int32_t* slots = nullptr,
                        int64_t base = 0) {
    if (n <= 0) return;
    if (aligned16(x) && reinterpret_cast<uintptr_t>(d16) % 8 == 0 && aligned16(d32) && base % 4 == 0)
      k_to16<true><<<grid_for((n + 3) / 4), kTpb, 0, cuda::stream()>>>(bf, x, d16, d32, n, slots, base);
    else
      k_to16<false><<<grid_for(n), kTpb, 0, cuda::stream()>>>(bf, x, d16, d32, n, slots, base);
    ZR_CUDA(cudaGetLastError());
  }
  void widen16_slots(DType dt, const uint16_t* h, float* dst32, int64_t n, const int32_t* slots) override {
    ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "widen16_slots needs bf16 or f16");
    if (n <= 0) return;
    k_widen_slots<<<grid_for(((n + 255) / 256) * 32), kTpb, 0, cuda::stream()>>>(dt == DType::BF16, h, dst32, n, slots);
    ZR_CUDA(cudaGetLastError());
  }
  LtGemm& lt() {
    if (!lt_) lt_ = std::make_unique<LtGemm>();
    return *lt_;
  }
  void gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, int64_t sA,
              const void* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC, int64_t batch) {
    const cudaDataType_t t = mm_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    ZR_CUBLAS(cublasGemmStridedBatchedEx(
        h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
        static_cast<int>(K), &alpha, B, t, static_cast<int>(ldb), sB, A, t, static_cast<int>(lda), sA, &beta, C,
        CUDA_R_32F, static_cast<int>(ldc), sC, static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // Throws the message of the first failed deferred id check since the last call (flag already copied back,
  // unless `fetch`) and clears the flag.
  void raise_deferred(bool fetch) {
    if (!ids_flag_) return;
    ids_unread_ = 0;
    if (fetch) cuda::fetch(ids_flag_host_, ids_flag_, sizeof(int));
    const int f = *ids_flag_host_;
    if (!f) return;
    *ids_flag_host_ = 0;
    ZR_CUDA(cudaMemsetAsync(ids_flag_, 0, sizeof(int), cuda::stream()));
    ZR_FAIL(ids_messages_.at(static_cast<size_t>(f - 1)));
  }
  static int dev_of_backend() {
    int d = 0;
    ZR_CUDA(cudaGetDevice(&d));
    return d;
  }
  // The blocks of 256 threads of `kernel` the GPU runs at once (SMs x blocks an SM; at least 1) with `smem` bytes
  // of dynamic shared memory (the most any launch of it takes, allowed here), worked out on its first launch and
  // kept.
  template <class K>
  int64_t wave_blocks(K kernel, size_t smem = 0) {
    auto [it, fresh] = waves_.try_emplace(reinterpret_cast<const void*>(kernel), 0);
    if (fresh) {
      int sms = 0, per = 0;
      ZR_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_of_backend()));
      if (smem > 48 * 1024)
        ZR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      ZR_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, 256, smem));
      it->second = std::max<int64_t>(1, static_cast<int64_t>(sms) * per);
    }
    return it->second;
  }
  DType mm_ = DType::F32;
  DevBuf<unsigned> done_;  // zeroed completion counters of the one-kernel column sums (each re-zeroes its own)
  // Attention's backward sums dQ with atomics in one kernel (5 products); ZERORUN_ATTN_ATOMICS=0 picks the
  // two atomic-free kernels (7 products, dQ the same bits every run).
  bool attn_atomics_ = true;
  // Grouped-query heads split the atomics path's key-block backward over the query heads (flash::tc_backward's
  // gqa_split: 1.11-1.29x faster on an H100 at the probe's grouped-query shapes); ZERORUN_ATTN_GQA_SPLIT=0: not.
  bool attn_gqa_split_ = true;
  // ZERORUN_DETERMINISTIC=1 / set_deterministic: the embedding gradient through a sort instead of atomics, and
  // attention's backward atomic-free, so a run gives the same bits every time.
  bool deterministic_ = false;
  std::unique_ptr<LtGemm> lt_;
  cublasHandle_t h_{};
  int* ids_flag_ = nullptr;                // device: 0, or 1 + the index of the first failed deferred check
  int* ids_flag_host_ = nullptr;           // pinned copy read at get_scalar
  std::vector<std::string> ids_messages_;  // code - 1 -> message
  std::map<std::string, int> ids_codes_;
  int64_t ids_unread_ = 0;                // checks queued since the flag was last read
  std::map<const void*, int64_t> waves_;  // wave_blocks, per kernel
};

}  // namespace

Backend* cuda_backend() {
  static CudaBackend* b = cuda::available() ? new CudaBackend() : nullptr;
  return b;
}

}  // namespace zerorun::kernels
