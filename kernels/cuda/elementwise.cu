// Elementwise maps on the GPU: add, mul, SwiGLU / GeGLU, activations, one-parameter maps, dropout, and the
// 16-bit rounding and widening of storage. Part of the CUDA backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

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

}  // namespace

void CudaBackend::act_fwd16(Act act, Src x, Dst y, int64_t n) {
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

void CudaBackend::widen16(const uint16_t* h, float* f, int64_t n) {
  map_mixed(Ident{}, h, kNoB, f, n, false, mm_ == DType::BF16);
}

void CudaBackend::act_bwd16(Act act, Src x, Src dy, Grad dx, int64_t n) {
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

void CudaBackend::add_fwd(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
  if (nb == n)
    elementwise<false>(Plus{}, a, b, y, n);
  else
    LAUNCH(k_add, n, a, b, y, n, nb);
}

void CudaBackend::add_bwd(const float* dy, Grad da, Grad db, int64_t n, int64_t nb) {
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

void CudaBackend::swiglu_fwd(Src g, Src u, Dst y, int64_t n) { pair_fwd(SwiGluF{}, g, u, y, n, mm_ == DType::BF16); }

void CudaBackend::swiglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) {
  pair_bwd(SwiGluF{}, g, u, dy, dg, du, n, mm_ == DType::BF16);
}

void CudaBackend::geglu_fwd(Src g, Src u, Dst y, int64_t n) { pair_fwd(GeGluF{}, g, u, y, n, mm_ == DType::BF16); }

void CudaBackend::geglu_bwd(Src g, Src u, Src dy, Grad dg, Grad du, int64_t n) {
  pair_bwd(GeGluF{}, g, u, dy, dg, du, n, mm_ == DType::BF16);
}

void CudaBackend::unary_fwd(cpu::Unary op, float a, const float* x, float* y, int64_t n) {
  qk::unary_fwd(op, a, x, y, n, cuda::stream());
}

void CudaBackend::dropout(const rng::Dropout& d, const float* x, Grad y, int64_t n) {
  ZR_CHECK(!y.h, "dropout takes f32 tensors");
  if (y.p) qk::dropout(d, x, y.p, y.acc, n, cuda::stream());
}

void CudaBackend::unary_bwd(cpu::Unary op, float a, const float* x, const float* dy, Grad dx, int64_t n) {
  ZR_CHECK(!dx.h, "unary ops take f32 gradients");
  if (dx.p) qk::unary_bwd(op, a, x, dy, dx.p, dx.acc, n, cuda::stream());
}

void CudaBackend::zero_rows(const int32_t* ids, int32_t value, float* x, int64_t N, int64_t C) {
  qk::zero_rows(ids, value, x, N, C, cuda::stream());
}

void CudaBackend::mul_fwd(Src a, Src b, Dst y, int64_t n) { pair_fwd(MulF{}, a, b, y, n, mm_ == DType::BF16); }

void CudaBackend::mul_bwd(Src a, Src b, Src dy, Grad da, Grad db, int64_t n) {
  pair_bwd(MulF{}, a, b, dy, da, db, n, mm_ == DType::BF16);
}

void CudaBackend::act_fwd(Act act, const float* x, float* y, int64_t n) {
  switch (act) {
    case Act::Gelu:
      return elementwise<false>(ActF<0>{}, x, nullptr, y, n);
    case Act::Relu:
      return elementwise<false>(ActF<1>{}, x, nullptr, y, n);
    default:
      return elementwise<false>(ActF<2>{}, x, nullptr, y, n);
  }
}

void CudaBackend::act_bwd(Act act, const float* x, const float* dy, Grad dx, int64_t n) {
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

void CudaBackend::accumulate(float* acc, const float* x, int64_t n) { elementwise<true>(AccA{}, x, nullptr, acc, n); }

void CudaBackend::round_to(DType dt, const float* src, float* dst, int64_t n) {
  if (dt == DType::F32) {
    if (src != dst)
      ZR_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
    return;
  }
  round_any(dt == DType::BF16, src, nullptr, dst, n);
}

void CudaBackend::round_to16(DType dt, const float* src, uint16_t* dst, float* dst32, int64_t n, const int32_t* slots,
                             int64_t base) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "round_to16 needs bf16 or f16");
  round_any(dt == DType::BF16, src, dst, dst32, n, slots, base);
}

// dst (+)= src: a plain copy when overwriting.
void CudaBackend::pass_grad(const float* src, Grad dst, int64_t n) {
  if (dst.h)
    round16(src, dst.h, n);
  else if (dst.acc)
    elementwise<true>(AccA{}, src, nullptr, dst.p, n);
  else if (n > 0)
    ZR_CUDA(cudaMemcpyAsync(dst.p, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
}

// For kernels that only accumulate: zero an overwrite target first.
float* CudaBackend::zeroed_unless_acc(Grad g, int64_t n) {
  if (g.p && !g.acc && n > 0) ZR_CUDA(cudaMemsetAsync(g.p, 0, static_cast<size_t>(n) * 4, cuda::stream()));
  return g.p;
}

// An f32 copy of a 16-bit input (empty when it is f32 already).
DevBuf<float> CudaBackend::widened(Src x, int64_t n) {
  if (!x.h) return {};
  DevBuf<float> f(static_cast<size_t>(n), false);
  widen16(x.h, f.p, n);
  return f;
}

CudaBackend::Half CudaBackend::to16(const float* x, int64_t n) const {
  Half h(static_cast<size_t>(n), false);
  round16(x, h.p, n);
  return h;
}

void CudaBackend::round16(const float* x, uint16_t* d, int64_t n) const {
  profile::Scope ps(".. to16");
  round_any(mm_ == DType::BF16, x, d, nullptr, n);
}

void CudaBackend::round_any(bool bf, const float* x, uint16_t* d16, float* d32, int64_t n, const int32_t* slots,
                            int64_t base) {
  if (n <= 0) return;
  if (aligned16(x) && reinterpret_cast<uintptr_t>(d16) % 8 == 0 && aligned16(d32) && base % 4 == 0)
    k_to16<true><<<grid_for((n + 3) / 4), kTpb, 0, cuda::stream()>>>(bf, x, d16, d32, n, slots, base);
  else
    k_to16<false><<<grid_for(n), kTpb, 0, cuda::stream()>>>(bf, x, d16, d32, n, slots, base);
  ZR_CUDA(cudaGetLastError());
}

void CudaBackend::widen16_slots(DType dt, const uint16_t* h, float* dst32, int64_t n, const int32_t* slots) {
  ZR_CHECK(dt == DType::BF16 || dt == DType::F16, "widen16_slots needs bf16 or f16");
  if (n <= 0) return;
  k_widen_slots<<<grid_for(((n + 255) / 256) * 32), kTpb, 0, cuda::stream()>>>(dt == DType::BF16, h, dst32, n, slots);
  ZR_CUDA(cudaGetLastError());
}

}  // namespace zerorun::kernels
