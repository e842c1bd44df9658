// Tensor-core causal flash attention for 16-bit runs (bf16 or fp16 operands,
// fp32 accumulation and softmax), head sizes 64, 80, 96, 128 and 256,
// FlashAttention-2 style: raw mma.sync m16n8k16 with the scores, probabilities
// and outputs held in registers (the score accumulator fragment is re-packed in
// place as the next product's A operand), tiles fed by ldmatrix from padded
// shared memory and double-buffered with cp.async.
//
// The kernels read 16-bit qkv [B, T, (H + 2K) D] and output gradient
// [B, T, H D] where they lie (strided rows, no packed copies; rows past T are
// zero-filled in shared memory), write the output in f32 or 16 bits, and the
// qkv gradient added into / written over f32, or written in 16 bits. Query
// head h reads key/value head h / (H / K) in place; the key/value kernels of
// the backward run over the key/value heads and add the gradient of every
// query head of the group in registers. Options (cpu::AttnDims): any scale, a
// sliding window and per-document masking of packed sequences (pos: no key
// before the query's document; each row's first key is the later of the two;
// key tiles wholly before every row's first key or after every row are
// skipped, the rest masked; the key-block backward ends at the last query
// whose document starts by its last key), Gemma 2's soft-capping (the backward
// recovers tanh from the probability: logit = log2(p) + lse). The softmax runs on exp2 of the scores
// times log2(e) * scale. The forward's tilings are swept by bench/attn_probe.cc
// (at head size 64 training uses 32 query rows a warp, 4 warps, 64-key tiles, Q
// re-read from shared memory). Blocks take every head's longest tile first
// (the causal tail wave then holds the short ones). The backward runs as
// FlashAttention-2's five products in one kernel per block of keys (head size
// 64: 128 keys, 32 a warp; 96 and 128: 128 keys, 16 a warp, 8 warps; 80 and
// 256: 64 keys, 16 a warp; dK, dV in registers, dQ added into an f32
// accumulator with atomics, once per query tile and key block; grouped-query
// heads split the key-block work over their query heads, dK and dV then added
// with atomics too); the atomic-free alternative (ZERORUN_ATTN_ATOMICS=0) is one kernel
// per key block and one per query block, seven products, the same bits every
// run. Candidates the probe sweeps (not yet defaults): FlashAttention-2's
// backward warp layout (k_bwd_sd: P^T and dS^T through shared memory, no
// product computed twice) at 96, 128 and 256, and its forward pipeline (one K
// and one V buffer, PL: two blocks an SM at 256); ZERORUN_ATTN_FWD_TILING_D<D>
// and ZERORUN_ATTN_BWD_VARIANT_D<D> make one the default for a run (env_default).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {

// p[0] += a, p[1] += b atomically: one 8-byte float2 atomic on sm_90 and later, two float atomics before it (the
// float2 overload does not exist there: the default architecture list starts at sm_80).
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

constexpr int kWarps = 4;        // warps per block, 16 rows each (backward)
constexpr int BR = 16 * kWarps;  // rows (queries or keys) a block owns = rows of a streamed tile
template <int HS>
constexpr int LDof = HS + 8;  // shared-memory row stride (elements): an odd number of 16-byte units, ldmatrix
                              // conflict-free
template <int HS>
constexpr int TileOf = BR* LDof<HS>;  // elements of one BR-row tile in shared memory
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The sizes and options as the kernels take them.
struct TcDims {
  int T, H, K, W, O, rep, window;  // W: a qkv row, O: an output row (elements)
  float qk;                        // no cap: raw q.k -> log2-domain logit (scale * log2(e))
  float pre2, post;                // cap: logit = tanh(q.k scale / softcap) * post, tanh(x) from ex2(x * pre2 / x)
  float inv_post;                  // 1 / post
  float scale;                     // the products dQ = dS K and dK = dS^T Q are multiplied by it
  bool cap;
  int split;  // key-block backward: blocks a key/value head's query heads are split over (1, or rep: one each, dK
              // and dV then added with atomics into an f32 accumulator)
  const int32_t* pos;  // [B, T]: each token's position in its document (null: one document a row)
};
TcDims tc_dims(const AttnDims& d) {
  TcDims p;
  p.T = (int)d.T, p.H = (int)d.H, p.K = (int)d.K, p.W = (int)d.width(), p.O = (int)d.out_width();
  p.rep = (int)d.rep(), p.window = (int)d.window;
  p.qk = d.scale * kLog2e;
  p.cap = d.softcap > 0.f;
  p.pre2 = p.cap ? 2.f * kLog2e * d.scale / d.softcap : 0.f;
  p.post = p.cap ? d.softcap * kLog2e : 0.f;
  p.inv_post = p.cap ? 1.f / p.post : 0.f;
  p.scale = d.scale;
  p.split = 1;
  p.pos = d.pos;
  return p;
}
// Whether a call needs the kernels' option variant (OPT): a window, a cap or documents.
bool needs_opt(const TcDims& p) { return p.window > 0 || p.cap || p.pos; }

// The first key query t (< T) of batch row b sees: the window's and, with pos, its document's.
__device__ inline int first_key(const TcDims& p, int window, int b, int t) {
  int f = window > 0 ? max(0, t - window + 1) : 0;
  if (p.pos) f = max(f, t - p.pos[(size_t)b * p.T + t]);
  return f;
}

// ---- PTX wrappers ----------------------------------------------------------------
template <bool BF>
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the special-function unit, denormal results flushed to zero (exp2f without fast-math adds the denormal
// scaling around the same instruction; probabilities below 2^-126 do not matter here). ex2(-inf) = 0.
__device__ inline float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The soft-capped log2-domain logit of a raw q.k: tanh(x) = 1 - 2 / (e^2x + 1) (absolute error ~1e-7; tanh.approx's
// is ~1e-3 of the cap), times softcap * log2(e).
__device__ inline float capped(float s, const TcDims& p) {
  return (1.f - __fdividef(2.f, ex2(s * p.pre2) + 1.f)) * p.post;
}
// The soft-cap's derivative 1 - tanh^2 at a probability p = 2^(logit - L) (L: the row's log2 log-sum-exp): tanh is
// (log2(p) + L) / post. 0 where p is (p multiplies it).
__device__ inline float dcap(float pr, float L, const TcDims& p) {
  if (pr <= 0.f) return 0.f;
  const float th = (__log2f(pr) + L) * p.inv_post;
  return 1.f - th * th;
}

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Four 8x8 16-bit matrices; lane l supplies the address of row l % 8 of matrix l / 8.
__device__ inline void ldsm4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldsm4_t(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ inline void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ inline void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <bool BF>
__device__ inline uint32_t pack2(float lo, float hi) {
  if constexpr (BF) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- tiles and warp-level products ------------------------------------------------
// A ROWS x HS tile: rows r0 .. r0 + ROWS - 1 of a head (`g` = its row 0, rows `ld` elements apart) into shared
// memory (stride LD); rows at or past T are zeros.
template <int HS, int ROWS = BR>
__device__ inline void load_tile(uint16_t* s, const uint16_t* g, int64_t ld, int r0, int T) {
  constexpr int LD = LDof<HS>;
  for (int i = threadIdx.x; i < ROWS * (HS / 8); i += blockDim.x) {
    const int r = i / (HS / 8), c = (i % (HS / 8)) * 8;
    if (r0 + r < T)
      cp16(s + r * LD + c, g + (size_t)(r0 + r) * ld + c);
    else
      *reinterpret_cast<uint4*>(s + r * LD + c) = make_uint4(0, 0, 0, 0);
  }
}

template <int NT>
using AccN = float[NT][4];  // a warp's 16 x 8NT fp32 tile: NT n-tiles of m16n8 accumulator fragments
template <int HS>
using AccO = AccN<HS / 8>;  // 16 rows x the head size
using AccS = AccN<BR / 8>;  // 16 rows x a 64-row tile's scores

template <int NT>
__device__ inline void zero(AccN<NT>& a) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[n][e] = 0.f;
}

template <int HS>
using Frag = uint32_t[HS / 16][4];  // a warp's 16 x HS A operand in registers: k-chunks of m16k16 fragments

// The A operand of 16 rows (shared, stride LD) into registers.
template <int HS>
__device__ inline void load_frag(Frag<HS>& f, const uint16_t* A, int lane) {
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) ldsm4(f[kc], A + (lane & 15) * LDof<HS> + kc * 16 + (lane >> 4) * 8);
}

// acc = A B^T: A = the warp's 16 rows (fragments), B = 64 rows (shared, stride LD), both 16 x / 64 x HS.
template <bool BF, int HS>
__device__ inline void mm_abt(AccS& acc, const Frag<HS>& a, const uint16_t* B, int lane) {
  constexpr int LD = LDof<HS>;
  zero(acc);
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) {
#pragma unroll
    for (int np = 0; np < BR / 16; ++np) {
      uint32_t b[4];
      ldsm4(b, B + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
      mma<BF>(acc[2 * np], a[kc], b[0], b[1]);
      mma<BF>(acc[2 * np + 1], a[kc], b[2], b[3]);
    }
  }
}

// acc += A M_kc: A = one 16 x 16 fragment, M_kc = rows kc * 16 .. +15 of M (shared, stride LD) x NC columns.
template <bool BF, int HS, int NC = HS>
__device__ inline void mm_a_rows(AccN<NC / 8>& acc, const uint32_t (&a)[4], const uint16_t* M, int kc, int lane) {
  constexpr int LD = LDof<HS>;
#pragma unroll
  for (int np = 0; np < NC / 16; ++np) {
    uint32_t b[4];
    ldsm4_t(b, M + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 + (lane >> 4) * 8);
    mma<BF>(acc[2 * np], a, b[0], b[1]);
    mma<BF>(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// acc += P M: P = 16 x 64 in accumulator layout (rounded to 16 bits here), M = 64 x NC (shared, stride LD).
template <bool BF, int HS, int NC = HS>
__device__ inline void mm_pm(AccN<NC / 8>& acc, const AccS& p, const uint16_t* M, int lane) {
#pragma unroll
  for (int kc = 0; kc < BR / 16; ++kc) {
    const uint32_t a[4] = {pack2<BF>(p[2 * kc][0], p[2 * kc][1]), pack2<BF>(p[2 * kc][2], p[2 * kc][3]),
                           pack2<BF>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                           pack2<BF>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
    mm_a_rows<BF, HS, NC>(acc, a, M, kc, lane);
  }
}

// acc = A B^T with A's 16 rows read from shared memory (stride LD) one k-chunk at a time (no fragments held).
template <bool BF, int HS>
__device__ inline void mm_abt_s(AccS& acc, const uint16_t* A, const uint16_t* B, int lane) {
  constexpr int LD = LDof<HS>;
  zero(acc);
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) {
    uint32_t a[4];
    ldsm4(a, A + (lane & 15) * LD + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < BR / 16; ++np) {
      uint32_t b[4];
      ldsm4(b, B + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
      mma<BF>(acc[2 * np], a, b[0], b[1]);
      mma<BF>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// dst rows (this lane's two rows of the warp's 16, `row0` = the first one's global index; rows >= T skipped)
// += mul * acc; dst points at column 0 of the head in row 0, rows `ld` apart.
template <bool BF, int HS>
__device__ inline void add_rows(const AccO<HS>& acc, float* dst, uint16_t* dst16, int64_t ld, int row0, int T, int lane,
                                float mul, bool accumulate) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    if (r >= T) continue;
    if (dst16) {  // 16-bit gradient: written, never accumulated
      uint16_t* d = dst16 + (size_t)r * ld + 2 * t;
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
        *reinterpret_cast<uint32_t*>(d + 8 * n) = pack2<BF>(mul * acc[n][2 * half], mul * acc[n][2 * half + 1]);
      continue;
    }
    float* d = dst + (size_t)r * ld + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      float2 v = accumulate ? *reinterpret_cast<float2*>(d + 8 * n) : make_float2(0.f, 0.f);
      v.x += mul * acc[n][2 * half];
      v.y += mul * acc[n][2 * half + 1];
      *reinterpret_cast<float2*>(d + 8 * n) = v;
    }
  }
}

// ---- row term ---------------------------------------------------------------------------
template <bool BF>
__device__ inline float from16(uint16_t u) {
  if constexpr (BF)
    return __bfloat162float(__ushort_as_bfloat16(u));
  else
    return __half2float(__ushort_as_half(u));
}
// Eight consecutive elements as f32 (16-byte aligned 16-bit data, 32-byte aligned f32 data).
template <bool BF, class O>
__device__ inline void ld8(const O* p, float (&v)[8]) {
  if constexpr (sizeof(O) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[2 * i] = from16<BF>(w[i] & 0xffffu), v[2 * i + 1] = from16<BF>(w[i] >> 16);
  } else {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// delta[b, h, t] = sum_i dO[b, t, h, i] O[b, t, h, i]: eight lanes per (b, t, h), eight elements a lane at a time
// (16-byte loads); a warp covers four consecutive (row, head) pairs. The loop is warp-uniform (the shuffles need all
// lanes).
template <bool BF, int HS, class O>
__global__ void k_delta(const O* out, const uint16_t* dout, float* delta, int B, int T, int H) {
  const int64_t n = (int64_t)B * H * T, step = (int64_t)gridDim.x * blockDim.x / 8;
  const int lane = threadIdx.x & 31, sub = lane & 7;
  for (int64_t base = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32 * 4; base < n; base += step) {
    const int64_t w = base + lane / 8;  // (b * T + t) * H + h
    float s = 0.f;
    if (w < n) {
      const int64_t row = (w / H) * H * HS + (w % H) * HS;
#pragma unroll
      for (int c = sub; c < HS / 8; c += 8) {
        float o[8], d[8];
        ld8<BF>(out + row + 8 * c, o);
        ld8<BF>(dout + row + 8 * c, d);
#pragma unroll
        for (int i = 0; i < 8; ++i) s += o[i] * d[i];
      }
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (w < n && sub == 0) {
      const int64_t bt = w / H;
      delta[(bt / T * H + w % H) * T + bt % T] = s;
    }
  }
}

// The (tile, head, batch) a block of a (tiles, H, B) grid works on. Tile 0 is the longest. LPT: every head's
// longest tile before any shorter one (blocks are issued in linear order, x fastest), so the last wave holds the
// shortest tiles; else tiles in grid order (each head's tiles, longest first, one head after another).
template <bool LPT>
__device__ inline int3 tile_of_block() {
  if constexpr (!LPT) return make_int3(blockIdx.x, blockIdx.y, blockIdx.z);
  const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), nbh = gridDim.y * gridDim.z;
  const int bh = lin % nbh;
  return make_int3(lin / nbh, bh % gridDim.y, bh / gridDim.y);
}

// Whether query t, whose first key is f, does not see key s.
__device__ inline bool hidden(int t, int s, int f) { return s > t || s < f; }

// ---- forward ------------------------------------------------------------------------
// Templated on the tiling (a sweep for bench/attn_probe.cc): MT m16 tiles of query rows per warp (MT = 2: every
// K / V fragment read from shared memory feeds two products), NW warps a block, KT keys a streamed tile, QR: the
// warp's Q fragments kept in registers (else re-read from shared memory every key tile, fewer registers), MB: the
// blocks an SM the registers are sized for (0: the compiler's choice). Training uses tiling 0 (fwd_e lists them).
// PL: FlashAttention-2's pipeline, one K and one V buffer (half the shared memory: more blocks an SM at large head
// sizes): V_j loads during S = Q K_j^T and its softmax, K_j+1 during O += P V_j.
template <int HS, int MT, int NW, int KT, bool QR, int MB, bool PL = false>
struct FwdCfg {
  static constexpr int BQ = 16 * MT * NW;  // query rows a block
  static constexpr size_t smem =
      2 * (size_t)(BQ * LDof<HS> + (PL ? 2 : 4) * KT * LDof<HS>);  // Q + (double-buffered) K, V
  static constexpr int NT = KT / 8;                                // n8 tiles of a score row
  static constexpr int kMinBlocks = MB > 0 ? MB : 1;
};

// acc[mt] = Q_mt K^T; K = NT * 8 rows (shared, stride LD). QR: Q_mt from the fragments qf, else from shared
// memory (Qw = the warp's first row, stride LD) one k-chunk at a time.
template <bool BF, int HS, int MT, int NT, bool QR>
__device__ inline void mm_qk(AccN<NT> (&acc)[MT], const Frag<HS> (&qf)[QR ? MT : 1], const uint16_t* Qw,
                             const uint16_t* K, int lane) {
  constexpr int LD = LDof<HS>;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) {
    uint32_t qs[MT][4];
    if constexpr (!QR)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm4(qs[mt], Qw + (mt * 16 + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldsm4(b, K + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (QR) {
          mma<BF>(acc[mt][2 * np], qf[mt][kc], b[0], b[1]);
          mma<BF>(acc[mt][2 * np + 1], qf[mt][kc], b[2], b[3]);
        } else {
          mma<BF>(acc[mt][2 * np], qs[mt], b[0], b[1]);
          mma<BF>(acc[mt][2 * np + 1], qs[mt], b[2], b[3]);
        }
      }
    }
  }
}

// acc[mt] += P_mt V (P in accumulator layout, rounded to 16 bits here); V = NT * 8 rows x HS.
template <bool BF, int HS, int MT, int NT>
__device__ inline void mm_pv(AccO<HS> (&acc)[MT], const AccN<NT> (&p)[MT], const uint16_t* V, int lane) {
  constexpr int LD = LDof<HS>;
#pragma unroll
  for (int kc = 0; kc < NT / 2; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack2<BF>(p[mt][2 * kc][0], p[mt][2 * kc][1]);
      a[mt][1] = pack2<BF>(p[mt][2 * kc][2], p[mt][2 * kc][3]);
      a[mt][2] = pack2<BF>(p[mt][2 * kc + 1][0], p[mt][2 * kc + 1][1]);
      a[mt][3] = pack2<BF>(p[mt][2 * kc + 1][2], p[mt][2 * kc + 1][3]);
    }
#pragma unroll
    for (int np = 0; np < HS / 16; ++np) {
      uint32_t b[4];
      ldsm4_t(b, V + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma<BF>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma<BF>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// OPT: the sliding window, soft-capping and documents compiled in (else p.window, p.cap and p.pos are ignored: plain
// causal attention, fewer registers).
template <bool BF, int HS, int MT, int NW, int KT, bool QR, int MB, bool LPT, bool OPT, bool PL = false>
__global__ void __launch_bounds__(32 * NW, (FwdCfg<HS, MT, NW, KT, QR, MB, PL>::kMinBlocks))
    k_fwd(const uint16_t* qkv, float* out, uint16_t* out16, float* lse, TcDims p) {
  using Cfg = FwdCfg<HS, MT, NW, KT, QR, MB, PL>;
  constexpr int BQ = Cfg::BQ, NT = Cfg::NT, QW = 16 * MT, LD = LDof<HS>;
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Qs = sm;            // [BQ][LD]
  uint16_t* Ks = Qs + BQ * LD;  // [2][KT][LD] (PL: [KT][LD])
  uint16_t* Vs = Ks + (PL ? 1 : 2) * KT * LD;
  const int3 tile = tile_of_block<LPT>();
  const int T = p.T, window = OPT ? p.window : 0;
  const bool cap = OPT && p.cap;
  const int nq = (T + BQ - 1) / BQ, qb = nq - 1 - tile.x;  // the longest rows first
  const int b = tile.z, h = tile.y, g = h / p.rep, q0 = qb * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int w0 = q0 + warp * QW;  // the warp's first query row
  const int64_t ld = p.W;
  const uint16_t* xb = qkv + (size_t)b * T * ld;
  const uint16_t* qh = xb + h * HS;
  const uint16_t *kh = xb + (p.H + g) * HS, *vh = xb + (p.H + p.K + g) * HS;
  // OPT: the first key each of this lane's rows sees (T for a row past T: every key hidden), the least over the
  // warp's rows, the largest over each m-tile's rows, and the least over the block's rows.
  int fr[MT][2], mmax[MT], wmin = 0, j0 = 0;
  if constexpr (OPT) {
    __shared__ int bmin[NW];
    int lo = INT_MAX;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = w0 + mt * 16 + gr + 8 * r;
        fr[mt][r] = t < T ? first_key(p, window, b, t) : T;
        lo = min(lo, fr[mt][r]);
      }
      mmax[mt] = __reduce_max_sync(0xffffffffu, max(fr[mt][0], fr[mt][1]));
    }
    wmin = __reduce_min_sync(0xffffffffu, lo);
    if (lane == 0) bmin[warp] = wmin;
    __syncthreads();
    int m = bmin[0];
#pragma unroll
    for (int w = 1; w < NW; ++w) m = min(m, bmin[w]);
    j0 = m / KT;  // key tiles from the one holding the block's least first key to the one holding its last query
  }
  const int nk = (min(T, q0 + BQ) + KT - 1) / KT;
  const float f = cap ? 1.f : p.qk;  // logits -> log2 domain (capped ones already are)
  load_tile<HS, BQ>(Qs, qh, ld, q0, T);
  load_tile<HS, KT>(Ks, kh, ld, j0 * KT, T);
  if constexpr (!PL) load_tile<HS, KT>(Vs, vh, ld, j0 * KT, T);
  cp_commit();
  Frag<HS> qf[QR ? MT : 1];  // unused without QR
  AccO<HS> o[MT];
  AccN<NT> s[MT];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(o[mt]);
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  for (int j = j0; j < nk; ++j) {
    const int buf = PL ? 0 : (j - j0) & 1;
    if constexpr (PL) {
      cp_wait<0>();     // K_j
      __syncthreads();  // (and every warp is done with V_j-1)
      load_tile<HS, KT>(Vs, vh, ld, j * KT, T);
      cp_commit();
    } else {
      if (j + 1 < nk) {
        load_tile<HS, KT>(Ks + (buf ^ 1) * KT * LD, kh, ld, (j + 1) * KT, T);
        load_tile<HS, KT>(Vs + (buf ^ 1) * KT * LD, vh, ld, (j + 1) * KT, T);
        cp_commit();
        cp_wait<1>();
      } else {
        cp_wait<0>();
      }
      __syncthreads();
    }
    if (QR && j == j0)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_frag<HS>(qf[QR ? mt : 0], Qs + (warp * QW + mt * 16) * LD, lane);
    const int k0 = j * KT;
    // Else every key of the tile is after all of the warp's queries, or before all of their first keys.
    const bool live = k0 <= w0 + QW - 1 && !(OPT && k0 + KT - 1 < wmin);
    if (live) {
      mm_qk<BF, HS, MT, NT, QR>(s, qf, Qs + warp * QW * LD, Ks + buf * KT * LD, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r0 = w0 + mt * 16;  // the m-tile's first query
        if (cap)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][n][e] = capped(s[mt][n][e], p);
        // The tile reaches past this m-tile's first query, or before a query's first key: mask.
        if (k0 + KT - 1 > r0 || (OPT && k0 < mmax[mt]))
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (hidden(r0 + gr + 8 * (e >> 1), k0 + 8 * n + 2 * t4 + (e & 1), OPT ? fr[mt][e >> 1] : 0))
                s[mt][n][e] = -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mn = fmaxf(m[mt][r], mx * f);              // running max, log2 domain
          const float mref = OPT && mn == -INFINITY ? 0.f : mn;  // a row with no key seen yet (window): p = 0
          const float corr = ex2(m[mt][r] - mref);               // m = -inf on the first tile: 0
          m[mt][r] = mn;
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            s[mt][n][2 * r] = ex2(fmaf(s[mt][n][2 * r], f, -mref));
            s[mt][n][2 * r + 1] = ex2(fmaf(s[mt][n][2 * r + 1], f, -mref));
            sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
          }
#pragma unroll
          for (int n = 0; n < HS / 8; ++n) {
            o[mt][n][2 * r] *= corr;
            o[mt][n][2 * r + 1] *= corr;
          }
          l[mt][r] = l[mt][r] * corr + sum;  // this lane's part of the row sum
        }
      }
    }
    if constexpr (PL) {
      cp_wait<0>();     // V_j
      __syncthreads();  // (and every warp is done with K_j)
      if (j + 1 < nk) {
        load_tile<HS, KT>(Ks, kh, ld, (j + 1) * KT, T);
        cp_commit();
      }
    }
    if (live) mm_pv<BF, HS, MT, NT>(o, s, Vs + buf * KT * LD, lane);
    if constexpr (!PL) __syncthreads();  // the buffer is refilled in the next iteration
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int tq = w0 + mt * 16 + gr + 8 * r;
      if (tq >= T) continue;
      const float inv = 1.f / lr;
      const size_t off = ((size_t)b * T + tq) * p.O + h * HS + 2 * t4;
      if (out16) {
#pragma unroll
        for (int n = 0; n < HS / 8; ++n)
          *reinterpret_cast<uint32_t*>(out16 + off + 8 * n) =
              pack2<BF>(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      } else {
#pragma unroll
        for (int n = 0; n < HS / 8; ++n)
          *reinterpret_cast<float2*>(out + off + 8 * n) = make_float2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      }
      if (t4 == 0) lse[((size_t)b * p.H + h) * T + tq] = (m[mt][r] + log2f(lr)) * kLn2;
    }
}

// ---- backward: dK, dV per key block --------------------------------------------------
// The key-block kernels run over (key block, key/value head g, batch) and iterate over the query tiles of every query
// head of g in turn: iteration `it` is query head g * rep + it / nj, query tile j0 + it % nj.
struct KvIter {
  int h, j;
};
__device__ inline KvIter kv_iter(int it, int h0, int j0, int nj) { return {h0 + it / nj, j0 + it % nj}; }
// The block's key/value head and first query head ((key block, K * split, B) grids).
__device__ inline int2 kv_heads(int y, const TcDims& p) {
  const int g = y / p.split;
  return make_int2(g, g * p.rep + y % p.split * (p.rep / p.split));
}
// dst rows (this lane's two of the warp's 16 from row0; rows >= T skipped; rows HS apart) += acc with float2 atomics.
template <int HS, int NC>
__device__ inline void atomic_rows(const AccN<NC / 8>& acc, float* dst, int row0, int T, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    if (r >= T) continue;
    float* d = dst + (size_t)r * HS + 2 * t;
#pragma unroll
    for (int n = 0; n < NC / 8; ++n)
      atomic_add2(d + 8 * n, acc[n][2 * half], acc[n][2 * half + 1]);
  }
}
// The query tiles after j0 whose queries see a key of [k0, k0 + keys): to the last key's window end.
__device__ inline int kv_tiles_end(int k0, int keys, int T, int window) {
  const int nt = (T + BR - 1) / BR;
  return window > 0 ? min(nt, (k0 + keys - 1 + window - 1) / BR + 1) : nt;
}

// With the window or documents (OPT), the key-block kernels keep per query tile the first key each query sees (Fs:
// [2][BR]) and the least and largest of them (Fb: [2][2]) in shared memory after the row terms.
constexpr size_t kRowSmem = sizeof(float) * 4 * BR + sizeof(int) * (2 * BR + 4);

// Row terms of query tile `t0` into shared memory: L = lse * log2(e) (+inf past T: p = 0), D = delta (0 past T);
// OPT: Fs, Fb of the tile (a query past T: T, every key hidden).
template <bool OPT>
__device__ inline void load_row_terms(float* Ls, float* Ds, int* Fs, int* Fb, const float* lse, const float* delta,
                                      int t0, const TcDims& p, int b) {
  const int T = p.T;
  for (int i = threadIdx.x; i < BR; i += blockDim.x) {
    const int t = t0 + i;
    Ls[i] = t < T ? lse[t] * kLog2e : INFINITY;
    Ds[i] = t < T ? delta[t] : 0.f;
  }
  if constexpr (OPT) {
    if (threadIdx.x < 32) {
      int lo = INT_MAX, hi = 0;
#pragma unroll
      for (int i = threadIdx.x; i < BR; i += 32) {
        const int t = t0 + i, f = t < T ? first_key(p, p.window, b, t) : T;
        Fs[i] = f;
        lo = min(lo, f);
        hi = max(hi, f);
      }
      lo = __reduce_min_sync(0xffffffffu, lo);
      hi = __reduce_max_sync(0xffffffffu, hi);
      if (threadIdx.x == 0) Fb[0] = lo, Fb[1] = hi;
    }
  }
}
// Iteration it's Q, dO tiles and row terms into buffer `buf` (one cp.async group).
template <int HS, bool OPT>
__device__ inline void load_q_iter(uint16_t* Qs, uint16_t* dOs, float* Ls, float* Ds, int* Fs, int* Fb, int buf,
                                   const uint16_t* xb, const uint16_t* db, const float* lse, const float* delta,
                                   const TcDims& p, int b, KvIter it) {
  constexpr int TILE = TileOf<HS>;
  load_tile<HS>(Qs + buf * TILE, xb + it.h * HS, p.W, it.j * BR, p.T);
  load_tile<HS>(dOs + buf * TILE, db + it.h * HS, p.O, it.j * BR, p.T);
  cp_commit();
  const size_t row = ((size_t)b * p.H + it.h) * p.T;
  load_row_terms<OPT>(Ls + buf * BR, Ds + buf * BR, Fs + buf * BR, Fb + buf * 2, lse + row, delta + row, it.j * BR, p,
                      b);
}
// The query tiles after j0 whose queries see a key of [k0, k0 + keys) (kv_tiles_end), with documents (OPT, pos) to
// the tile of the last query whose document starts by the block's last key (a scan over the later queries).
template <bool OPT>
__device__ inline int kv_tiles_end_opt(int k0, int keys, const TcDims& p, int window, int b) {
  const int nt = kv_tiles_end(k0, keys, p.T, window);
  if (!OPT || !p.pos) return nt;
  __shared__ int last;
  if (threadIdx.x == 0) last = k0;
  __syncthreads();
  const int klast = min(k0 + keys, p.T) - 1, tend = min(p.T, nt * BR);
  int mx = -1;
  for (int t = k0 + threadIdx.x; t < tend; t += blockDim.x)
    if (t - p.pos[(size_t)b * p.T + t] <= klast) mx = t;
  if (mx >= 0) atomicMax(&last, mx);
  __syncthreads();
  return min(nt, last / BR + 1);
}

// dQ rows warp*16 .. +15 of the query tile starting at row q0: dS (queries x the block's KEYS keys; dS^T in shared
// memory, read transposed) times K (shared, KEYS rows; NC of its columns), added into the f32 accumulator dqh
// [T, HS] (the same NC columns) with float2 atomics; `acc` is the scratch tile.
template <bool BF, int HS, int KEYS, int NC = HS>
__device__ inline void add_dq(AccN<NC / 8>& acc, const uint16_t* dSs, const uint16_t* Ks, float* dqh, int q0, int T,
                              int warp, int lane) {
  constexpr int LD = LDof<HS>;
  zero(acc);
#pragma unroll
  for (int kc = 0; kc < KEYS / 16; ++kc) {
    uint32_t a[4];
    ldsm4_t(a, dSs + (kc * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + warp * 16 + ((lane >> 3) & 1) * 8);
    mm_a_rows<BF, HS, NC>(acc, a, Ks, kc, lane);
  }
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row >= T) continue;
    float* d = dqh + (size_t)row * HS + 2 * t4;
#pragma unroll
    for (int n = 0; n < NC / 8; ++n)
      atomic_add2(d + 8 * n, acc[n][2 * r], acc[n][2 * r + 1]);
  }
}

// DQ = false: dK and dV only (k_bwd_q computes dQ). DQ = true: FlashAttention-2's five products in this one kernel:
// each warp's dS^T rows go to shared memory, and the block's dQ for the query tile, dS K over its 64 keys, is
// added into an f32 accumulator [B, H, T, HS] with float2 atomics (k_dq_out writes it into the qkv gradient).
// Faster than k_bwd_kv<false> + k_bwd_q, but the order of the additions into dQ varies from run to run.
// NB: Q / dO buffers (2: the next query tile loads during this one; 1 at head size 256, for shared memory). KW: warps
// of 16 keys a block (4: 64 keys; 8: 128 keys, so every Q / dO tile loaded and every dQ atomic serves twice the keys).
template <int HS, bool DQ, int NB, int KW = kWarps>
constexpr size_t kv_smem() {
  return 2 * (size_t)((2 + (DQ ? 1 : 0)) * 16 * KW * LDof<HS> + 2 * NB * TileOf<HS>)+kRowSmem;
}

// CS = 2: two warps a 16-key row group, each accumulating half of dK's and dV's columns (both compute the group's
// S^T and dP^T: 7 products' work for 5, but half the accumulator registers; head size 256 spills without it);
// A operands of those products then come from shared memory a k-chunk at a time.
template <bool BF, int HS, bool DQ, int MB = 3, bool FX = true, bool LPT = false, int NB = 2, bool OPT = false,
          int CS = 1, bool SP = false, int KW = kWarps>
__global__ void __launch_bounds__(32 * KW * CS, MB)
    k_bwd_kv(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dq_acc, float* dkv_acc, TcDims p, bool acc) {
  static_assert(CS == 1 || KW == kWarps, "the dK / dV column split takes 64-key blocks");
  constexpr int LD = LDof<HS>, TILE = TileOf<HS>, KEYS = 16 * KW, KTILE = KEYS * LD;
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Ks = sm;                                             // [KEYS][LD]
  uint16_t* Vs = Ks + KTILE;                                     // [KEYS][LD]
  uint16_t* Qs = Vs + KTILE;                                     // [NB][BR][LD]
  uint16_t* dOs = Qs + NB * TILE;                                // [NB][BR][LD]
  uint16_t* dSs = dOs + NB * TILE;                               // DQ: [KEYS][LD], dS^T of the query tile
  float* Ls = reinterpret_cast<float*>(dSs + (DQ ? KTILE : 0));  // [2][BR]
  float* Ds = Ls + 2 * BR;                                       // [2][BR]
  int* Fs = reinterpret_cast<int*>(Ds + 2 * BR);                 // OPT: [2][BR]
  int* Fb = Fs + 2 * BR;                                         // OPT: [2][2]
  const int3 tile = tile_of_block<LPT>();
  const int T = p.T, window = OPT ? p.window : 0;
  const bool cap = OPT && p.cap;
  const int kt = tile.x;  // key block 0 has the most query tiles
  const int b = tile.z, k0 = kt * KEYS, j0 = k0 / BR;
  const int2 heads = SP ? kv_heads(tile.y, p) : make_int2(tile.y, tile.y * p.rep);
  const int g = heads.x, h0 = heads.y;
  constexpr int HC = HS / CS;  // dK / dV columns a warp accumulates
  const int lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int warp = threadIdx.x / 32 % KW, half = threadIdx.x / 32 / KW;  // key row group, column part
  const int kw = k0 + warp * 16;                                         // the warp's first key
  // dQ (DQ): the query tile's rows in groups of 16 a warp (kWarps groups), its columns in QPARTS parts.
  constexpr int QPARTS = CS * KW / kWarps, NCQ = HS / QPARTS;
  const int qrow = warp % kWarps, qpart = CS > 1 ? half : warp / kWarps;
  const int64_t ld = p.W;
  const uint16_t* xb = qkv + (size_t)b * T * ld;
  const uint16_t* db = dout + (size_t)b * T * p.O;
  const int nj = kv_tiles_end_opt<OPT>(k0, KEYS, p, window, b) - j0, n_it = (SP ? p.rep / p.split : p.rep) * nj;
  load_tile<HS, KEYS>(Ks, xb + (p.H + g) * HS, ld, k0, T);
  load_tile<HS, KEYS>(Vs, xb + (p.H + p.K + g) * HS, ld, k0, T);
  load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, 0, xb, db, lse, delta, p, b, kv_iter(0, h0, j0, nj));
  AccN<HC / 8> dk, dv;
  AccS s, dp;
  constexpr bool KS = CS > 1 || HS > 128;  // K / V rows read a k-chunk at a time (no fragments held)
  Frag<KS ? 16 : HS> kf, vf;  // else the warp's K and V rows (read from shared memory every tile: keeping them
                              // for the kernel costs occupancy)
  zero(dk);
  zero(dv);
  for (int i = 0; i < n_it; ++i) {
    const KvIter it = kv_iter(i, h0, j0, nj);
    const int buf = NB == 2 ? i & 1 : 0;
    if (NB == 2 && i + 1 < n_it) {
      load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, buf ^ 1, xb, db, lse, delta, p, b, kv_iter(i + 1, h0, j0, nj));
      cp_wait<1>();
    } else {
      if (NB == 1 && i > 0) load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, 0, xb, db, lse, delta, p, b, it);
      cp_wait<0>();
    }
    __syncthreads();
    const uint16_t* Qb = Qs + buf * TILE;
    const uint16_t* dOb = dOs + buf * TILE;
    const int rb = NB == 2 ? buf : 0;
    const float* Lb = Ls + rb * BR;
    const float* Db = Ds + rb * BR;
    const int* Fq = Fs + rb * BR;
    const int q0 = it.j * BR;
    // Whether some query of the tile sees some key of the warp (else dS^T = 0), and whether the tile needs a mask.
    const bool live = q0 + BR - 1 >= kw && !(OPT && Fb[2 * rb] > kw + 15);
    const bool masked_tile = q0 < kw + 15 || (OPT && Fb[2 * rb + 1] > kw);
    if (live) {
      if constexpr (KS) {
        mm_abt_s<BF, HS>(s, Ks + warp * 16 * LD, Qb, lane);  // S^T (keys x queries)
      } else {
        load_frag<HS>(kf, Ks + warp * 16 * LD, lane);
        mm_abt<BF, HS>(s, kf, Qb, lane);
      }
#pragma unroll
      for (int n = 0; n < BR / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * n + 2 * t4 + (e & 1);  // query within the tile
          const bool masked = masked_tile && hidden(q0 + c, kw + gr + 8 * (e >> 1), OPT ? Fq[c] : 0);
          const float x = cap ? capped(s[n][e], p) - Lb[c] : s[n][e] * p.qk - Lb[c];
          s[n][e] = masked ? 0.f : FX ? ex2(x) : exp2f(x);  // P^T
        }
      mm_pm<BF, HS, HC>(dv, s, dOb + half * HC, lane);  // dV += P^T dO
      if constexpr (KS) {
        mm_abt_s<BF, HS>(dp, Vs + warp * 16 * LD, dOb, lane);  // dP^T = V dO^T
      } else {
        load_frag<HS>(vf, Vs + warp * 16 * LD, lane);
        mm_abt<BF, HS>(dp, vf, dOb, lane);
      }
#pragma unroll
      for (int n = 0; n < BR / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * n + 2 * t4 + (e & 1);
          dp[n][e] = s[n][e] * (dp[n][e] - Db[c]);  // dS^T
          if (cap) dp[n][e] *= dcap(s[n][e], Lb[c], p);
        }
      mm_pm<BF, HS, HC>(dk, dp, Qb + half * HC, lane);  // dK += dS^T Q (times the scale when written)
    } else if constexpr (DQ) {
      zero(dp);
    }
    if constexpr (DQ) {
      if (half == 0)  // (the other column part's warp holds the same dS^T)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)  // dS^T rows (keys) into shared memory, rounded as the products use it
#pragma unroll
          for (int n = 0; n < BR / 8; ++n)
            *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + gr + 8 * rh) * LD + 8 * n + 2 * t4) =
                pack2<BF>(dp[n][2 * rh], dp[n][2 * rh + 1]);
      __syncthreads();
      AccN<NCQ / 8> dq;
      add_dq<BF, HS, KEYS, NCQ>(dq, dSs, Ks + qpart * NCQ, dq_acc + ((size_t)b * p.H + it.h) * T * HS + qpart * NCQ, q0,
                                T, qrow, lane);
    }
    __syncthreads();
  }
  float* base = dqkv ? dqkv + (size_t)b * T * ld : nullptr;
  uint16_t* base16 = dqkv16 ? dqkv16 + (size_t)b * T * ld : nullptr;
  if (SP) {  // split: [2][B, K, T, HS] accumulators (k_kv_out writes them)
    float* dka = dkv_acc + ((size_t)b * p.K + g) * T * HS + half * HC;
    atomic_rows<HS, HC>(dk, dka, kw, T, lane);
    atomic_rows<HS, HC>(dv, dka + (size_t)gridDim.z * p.K * T * HS, kw, T, lane);
    return;
  }
  const int ko = (p.H + g) * HS + half * HC, vo = (p.H + p.K + g) * HS + half * HC;
  add_rows<BF, HC>(dk, base ? base + ko : nullptr, base16 ? base16 + ko : nullptr, ld, kw, T, lane, p.scale, acc);
  add_rows<BF, HC>(dv, base ? base + vo : nullptr, base16 ? base16 + vo : nullptr, ld, kw, T, lane, 1.f, acc);
}

// The one-kernel backward with two m16 tiles of keys a warp (32 keys a warp, 128 a block; head size 64): every
// Q / dO fragment read from shared memory feeds two products, and each query tile's dQ (atomics) is added once per
// 128 keys rather than per 64. The 64-query tile is taken QH queries at a time (the score tiles of 32 x QH stay
// within the registers next to dK, dV's 32 x 64 each); KR: the warp's K and V fragments held in registers for the
// whole kernel (else re-read from shared memory every product).
constexpr int KB2 = 2 * BR;  // keys a block
constexpr int HS2 = 64;      // its head size
constexpr size_t kKv2Smem = 2 * (size_t)(2 * KB2 * LDof<HS2> + 4 * TileOf<HS2> + KB2 * LDof<HS2>)+kRowSmem;

template <bool BF, int QH, bool KR, int MB, bool LPT, bool OPT, bool SP = false>
__global__ void __launch_bounds__(32 * kWarps, MB)
    k_bwd_kv2(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
              uint16_t* dqkv16, float* dq_acc, float* dkv_acc, TcDims p, bool acc) {
  constexpr int HS = HS2, LD = LDof<HS>, TILE = TileOf<HS>;
  constexpr int NQ = QH / 8;  // n8 tiles of a score row
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Ks = sm;                                     // [KB2][LD]
  uint16_t* Vs = Ks + KB2 * LD;                          // [KB2][LD]
  uint16_t* Qs = Vs + KB2 * LD;                          // [2][BR][LD]
  uint16_t* dOs = Qs + 2 * TILE;                         // [2][BR][LD]
  uint16_t* dSs = dOs + 2 * TILE;                        // [KB2 keys][LD]: dS^T of the query tile
  float* Ls = reinterpret_cast<float*>(dSs + KB2 * LD);  // [2][BR]
  float* Ds = Ls + 2 * BR;                               // [2][BR]
  int* Fs = reinterpret_cast<int*>(Ds + 2 * BR);         // OPT: [2][BR]
  int* Fb = Fs + 2 * BR;                                 // OPT: [2][2]
  const int3 tile = tile_of_block<LPT>();
  const int T = p.T, window = OPT ? p.window : 0;
  const bool cap = OPT && p.cap;
  const int kb = tile.x;  // key block 0 has the most query tiles
  const int b = tile.z, k0 = kb * KB2, j0 = 2 * kb;
  const int2 heads = SP ? kv_heads(tile.y, p) : make_int2(tile.y, tile.y * p.rep);
  const int g = heads.x, h0 = heads.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int kw = k0 + warp * 32;  // the warp's first key
  const int64_t ld = p.W;
  const uint16_t* xb = qkv + (size_t)b * T * ld;
  const uint16_t* db = dout + (size_t)b * T * p.O;
  const int nj = kv_tiles_end_opt<OPT>(k0, KB2, p, window, b) - j0, n_it = (SP ? p.rep / p.split : p.rep) * nj;
  load_tile<HS, KB2>(Ks, xb + (p.H + g) * HS, ld, k0, T);
  load_tile<HS, KB2>(Vs, xb + (p.H + p.K + g) * HS, ld, k0, T);
  load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, 0, xb, db, lse, delta, p, b, kv_iter(0, h0, j0, nj));
  AccO<HS> dk[2], dv[2];
  Frag<HS> kf[KR ? 2 : 1], vf[KR ? 2 : 1];  // unused without KR
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) zero(dk[mt]), zero(dv[mt]);
  for (int i = 0; i < n_it; ++i) {
    const KvIter it = kv_iter(i, h0, j0, nj);
    const int buf = i & 1;
    if (i + 1 < n_it) {
      load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, buf ^ 1, xb, db, lse, delta, p, b, kv_iter(i + 1, h0, j0, nj));
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (KR && i == 0)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        load_frag<HS>(kf[KR ? mt : 0], Ks + (warp * 32 + mt * 16) * LD, lane);
        load_frag<HS>(vf[KR ? mt : 0], Vs + (warp * 32 + mt * 16) * LD, lane);
      }
    const uint16_t* Qb = Qs + buf * TILE;
    const uint16_t* dOb = dOs + buf * TILE;
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;
    const int* Fq = Fs + buf * BR;
    const int fmin = OPT ? Fb[2 * buf] : 0, fmax = OPT ? Fb[2 * buf + 1] : 0;  // (of the whole 64-query tile)
#pragma unroll
    for (int hf = 0; hf < BR / QH; ++hf) {
      const int q0 = it.j * BR + hf * QH;  // the part's first query
      AccN<NQ> s[2], dp[2];                // P^T, then dS^T (the warp's 32 keys x QH queries)
      // Every query before every key of the warp, or every key before every query's first key: all masked.
      if (q0 + QH - 1 < kw || (OPT && fmin > kw + 31)) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[mt][n][e] = 0.f;
      } else {
        const uint16_t* Qh = Qb + hf * QH * LD;
        const uint16_t* dOh = dOb + hf * QH * LD;
        mm_qk<BF, HS, 2, NQ, KR>(s, kf, Ks + warp * 32 * LD, Qh, lane);  // S^T = K Q^T
        const bool diag = q0 < kw + 31 || (OPT && fmax > kw);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = hf * QH + 8 * n + 2 * t4 + (e & 1);  // query within the tile
              const bool masked = diag && hidden(it.j * BR + c, kw + mt * 16 + gr + 8 * (e >> 1), OPT ? Fq[c] : 0);
              const float x = cap ? capped(s[mt][n][e], p) - Lb[c] : s[mt][n][e] * p.qk - Lb[c];
              s[mt][n][e] = masked ? 0.f : ex2(x);  // P^T
            }
        mm_pv<BF, HS, 2, NQ>(dv, s, dOh, lane);                            // dV += P^T dO
        mm_qk<BF, HS, 2, NQ, KR>(dp, vf, Vs + warp * 32 * LD, dOh, lane);  // dP^T = V dO^T
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = hf * QH + 8 * n + 2 * t4 + (e & 1);
              dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - Db[c]);  // dS^T
              if (cap) dp[mt][n][e] *= dcap(s[mt][n][e], Lb[c], p);
            }
        mm_pv<BF, HS, 2, NQ>(dk, dp, Qh, lane);  // dK += dS^T Q (times the scale when written)
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)  // dS^T rows (keys) into shared memory, rounded as the products use it
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
            *reinterpret_cast<uint32_t*>(dSs + (warp * 32 + mt * 16 + gr + 8 * r) * LD + hf * QH + 8 * n + 2 * t4) =
                pack2<BF>(dp[mt][n][2 * r], dp[mt][n][2 * r + 1]);
    }
    __syncthreads();
    AccO<HS> dq;
    add_dq<BF, HS, KB2>(dq, dSs, Ks, dq_acc + ((size_t)b * p.H + it.h) * T * HS, it.j * BR, T, warp, lane);
    __syncthreads();
  }
  float* base = dqkv ? dqkv + (size_t)b * T * ld : nullptr;
  uint16_t* base16 = dqkv16 ? dqkv16 + (size_t)b * T * ld : nullptr;
  if (SP) {  // split: [2][B, K, T, HS] accumulators (k_kv_out writes them)
    float* dka = dkv_acc + ((size_t)b * p.K + g) * T * HS;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      atomic_rows<HS, HS>(dk[mt], dka, kw + mt * 16, T, lane);
      atomic_rows<HS, HS>(dv[mt], dka + (size_t)gridDim.z * p.K * T * HS, kw + mt * 16, T, lane);
    }
    return;
  }
  const int ko = (p.H + g) * HS, vo = (p.H + p.K + g) * HS;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    add_rows<BF, HS>(dk[mt], base ? base + ko : nullptr, base16 ? base16 + ko : nullptr, ld, kw + mt * 16, T, lane,
                     p.scale, acc);
    add_rows<BF, HS>(dv[mt], base ? base + vo : nullptr, base16 ? base16 + vo : nullptr, ld, kw + mt * 16, T, lane, 1.f,
                     acc);
  }
}

// ---- backward: FlashAttention-2's warp layout (P^T and dS^T through shared memory) ---------------------------------
// One kernel per block of KEYS = 16 * KMT * WK keys, 8 warps, the five products without duplicated work: warp
// (kg, qg) computes S^T and dP^T for KMT m16 tiles of keys (key group kg of WK) against the query tile's queries
// qg * QN .. +QN - 1 (QN = 64 / WQ, WK * WQ = 8 warps), writes P^T and dS^T (16-bit) to shared memory; then warp
// (kg, dpart) adds dV += P^T dO and dK += dS^T Q for its keys and HS / WD of the columns (WD = 8 / WK), the A
// operands read from shared memory, so each K, V, Q, dO fragment read feeds KMT or more products; dQ = dS K over
// the block's keys as in k_bwd_kv (rows in 4 groups of 16, columns in 2 parts, DQP passes), added with atomics.
// The dK, dV accumulators: 2 * KMT * HS / WD / 8 * 4 registers (128 at 128 / 4 / 2 and at 256 / 2 / 4).
constexpr int kSdWarps = 8;
constexpr int LDP = BR + 8;  // P^T, dS^T rows (keys) in shared memory: 64 queries + 8 (ldmatrix conflict-free)
template <int HS, int KEYS, int NB>
constexpr size_t sd_smem() {
  return 2 * (size_t)(2 * KEYS * LDof<HS> + 2 * NB * TileOf<HS> + 2 * KEYS * LDP) + kRowSmem;
}

// acc[mt] += A_mt M: A = MT * 16 rows (shared, stride LDA) x 16 * KC columns (the k dimension), M = 16 * KC rows
// (shared, stride LDof<HS>) x NC columns; each M fragment read feeds MT products.
template <bool BF, int HS, int MT, int NC, int LDA, int KC>
__device__ inline void mm_sa(AccN<NC / 8> (&acc)[MT], const uint16_t* A, const uint16_t* M, int lane) {
  constexpr int LD = LDof<HS>;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldsm4(a[mt], A + (mt * 16 + (lane & 15)) * LDA + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < NC / 16; ++np) {
      uint32_t b[4];
      ldsm4_t(b, M + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma<BF>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma<BF>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <bool BF, int HS, int KMT, int WK, int NB, int DQP, bool OPT, bool SP>
__global__ void __launch_bounds__(32 * kSdWarps, 1)
    k_bwd_sd(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dq_acc, float* dkv_acc, TcDims p, bool acc) {
  constexpr int LD = LDof<HS>, TILE = TileOf<HS>, KM = 16 * KMT, KEYS = KM * WK, WQ = kSdWarps / WK, QN = BR / WQ;
  constexpr int NQ = QN / 8, WD = kSdWarps / WK, HC = HS / WD, NCQ = HS / 2 / DQP;
  static_assert(NQ % 2 == 0 && HC % 16 == 0 && NCQ % 16 == 0, "whole ldmatrix x4 tiles");
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Ks = sm;                                       // [KEYS][LD]
  uint16_t* Vs = Ks + KEYS * LD;                           // [KEYS][LD]
  uint16_t* Qs = Vs + KEYS * LD;                           // [NB][BR][LD]
  uint16_t* dOs = Qs + NB * TILE;                          // [NB][BR][LD]
  uint16_t* Ps = dOs + NB * TILE;                          // [KEYS][LDP]: P^T of the query tile
  uint16_t* dSs = Ps + KEYS * LDP;                         // [KEYS][LDP]: dS^T
  float* Ls = reinterpret_cast<float*>(dSs + KEYS * LDP);  // [2][BR]
  float* Ds = Ls + 2 * BR;                                 // [2][BR]
  int* Fs = reinterpret_cast<int*>(Ds + 2 * BR);           // OPT: [2][BR]
  int* Fb = Fs + 2 * BR;                                   // OPT: [2][2]
  const int3 tile = tile_of_block<true>();
  const int T = p.T, window = OPT ? p.window : 0;
  const bool cap = OPT && p.cap;
  const int b = tile.z, k0 = tile.x * KEYS, j0 = k0 / BR;
  const int2 heads = SP ? kv_heads(tile.y, p) : make_int2(tile.y, tile.y * p.rep);
  const int g = heads.x, h0 = heads.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int kg = warp % WK, qg = warp / WK, dpart = warp / WK;  // S phase (kg, qg); dK / dV phase (kg, dpart)
  const int kw = k0 + kg * KM;                                  // the warp's first key
  const int qrow = warp % kWarps, qpart = warp / kWarps;        // dQ: 16 rows, half the columns
  const int64_t ld = p.W;
  const uint16_t* xb = qkv + (size_t)b * T * ld;
  const uint16_t* db = dout + (size_t)b * T * p.O;
  const int nj = kv_tiles_end_opt<OPT>(k0, KEYS, p, window, b) - j0, n_it = (SP ? p.rep / p.split : p.rep) * nj;
  load_tile<HS, KEYS>(Ks, xb + (p.H + g) * HS, ld, k0, T);
  load_tile<HS, KEYS>(Vs, xb + (p.H + p.K + g) * HS, ld, k0, T);
  load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, 0, xb, db, lse, delta, p, b, kv_iter(0, h0, j0, nj));
  AccN<HC / 8> dk[KMT], dv[KMT];
  Frag<HS> nof[1];  // (mm_qk's unused fragments: A operands come from shared memory)
#pragma unroll
  for (int mt = 0; mt < KMT; ++mt) zero(dk[mt]), zero(dv[mt]);
  for (int i = 0; i < n_it; ++i) {
    const KvIter it = kv_iter(i, h0, j0, nj);
    const int buf = NB == 2 ? i & 1 : 0;
    if (NB == 2 && i + 1 < n_it) {
      load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, buf ^ 1, xb, db, lse, delta, p, b, kv_iter(i + 1, h0, j0, nj));
      cp_wait<1>();
    } else {
      if (NB == 1 && i > 0) load_q_iter<HS, OPT>(Qs, dOs, Ls, Ds, Fs, Fb, 0, xb, db, lse, delta, p, b, it);
      cp_wait<0>();
    }
    __syncthreads();
    const uint16_t* Qb = Qs + buf * TILE;
    const uint16_t* dOb = dOs + buf * TILE;
    const int rb = NB == 2 ? buf : 0;
    const float* Lb = Ls + rb * BR;
    const float* Db = Ds + rb * BR;
    const int* Fq = Fs + rb * BR;
    const int q0 = it.j * BR, qw = q0 + qg * QN;  // the tile's and the S-phase warp's first query
    {
      AccN<NQ> s[KMT], dp[KMT];
      // Whether some query of the warp's sees some key of the warp's (else P^T = dS^T = 0), and whether to mask.
      const bool live = qw + QN - 1 >= kw && !(OPT && Fb[2 * rb] > kw + KM - 1);
      if (live) {
        const uint16_t* Qw = Qb + qg * QN * LD;
        const uint16_t* dOw = dOb + qg * QN * LD;
        mm_qk<BF, HS, KMT, NQ, false>(s, nof, Ks + kg * KM * LD, Qw, lane);  // S^T = K Q^T
        const bool masked_tile = qw < kw + KM - 1 || (OPT && Fb[2 * rb + 1] > kw);
#pragma unroll
        for (int mt = 0; mt < KMT; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = qg * QN + 8 * n + 2 * t4 + (e & 1);  // query within the tile
              const bool masked = masked_tile && hidden(q0 + c, kw + mt * 16 + gr + 8 * (e >> 1), OPT ? Fq[c] : 0);
              const float x = cap ? capped(s[mt][n][e], p) - Lb[c] : s[mt][n][e] * p.qk - Lb[c];
              s[mt][n][e] = masked ? 0.f : ex2(x);  // P^T
            }
        mm_qk<BF, HS, KMT, NQ, false>(dp, nof, Vs + kg * KM * LD, dOw, lane);  // dP^T = V dO^T
#pragma unroll
        for (int mt = 0; mt < KMT; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = qg * QN + 8 * n + 2 * t4 + (e & 1);
              dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - Db[c]);  // dS^T
              if (cap) dp[mt][n][e] *= dcap(s[mt][n][e], Lb[c], p);
            }
      } else {
#pragma unroll
        for (int mt = 0; mt < KMT; ++mt) zero(s[mt]), zero(dp[mt]);
      }
#pragma unroll
      for (int mt = 0; mt < KMT; ++mt)  // P^T, dS^T rows (keys) into shared memory, rounded as the products use them
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < NQ; ++n) {
            const int o = (kg * KM + mt * 16 + gr + 8 * r) * LDP + qg * QN + 8 * n + 2 * t4;
            *reinterpret_cast<uint32_t*>(Ps + o) = pack2<BF>(s[mt][n][2 * r], s[mt][n][2 * r + 1]);
            *reinterpret_cast<uint32_t*>(dSs + o) = pack2<BF>(dp[mt][n][2 * r], dp[mt][n][2 * r + 1]);
          }
    }
    __syncthreads();
    // dV += P^T dO, dK += dS^T Q (times the scale when written) over the tile's queries, unless every query is before
    // every key of the warp (or, OPT, every key before every query's first key).
    if (q0 + BR - 1 >= kw && !(OPT && Fb[2 * rb] > kw + KM - 1)) {
      mm_sa<BF, HS, KMT, HC, LDP, BR / 16>(dv, Ps + kg * KM * LDP, dOb + dpart * HC, lane);
      mm_sa<BF, HS, KMT, HC, LDP, BR / 16>(dk, dSs + kg * KM * LDP, Qb + dpart * HC, lane);
    }
    // dQ rows qrow * 16 .. +15 of the tile (unless all before the block's first key): dS K, columns qpart's.
    if (q0 + qrow * 16 + 15 >= k0) {
#pragma unroll
      for (int ps = 0; ps < DQP; ++ps) {
        const int c0 = qpart * (HS / 2) + ps * NCQ;
        AccN<NCQ / 8> dq;
        zero(dq);
#pragma unroll
        for (int kc = 0; kc < KEYS / 16; ++kc) {
          if (k0 + kc * 16 <= q0 + qrow * 16 + 15) {  // (else keys after every row of the warp: dS = 0)
            uint32_t a[4];
            ldsm4_t(a, dSs + (kc * 16 + (lane >> 4) * 8 + (lane & 7)) * LDP + qrow * 16 + ((lane >> 3) & 1) * 8);
            mm_a_rows<BF, HS, NCQ>(dq, a, Ks + c0, kc, lane);
          }
        }
        float* dqh = dq_acc + ((size_t)b * p.H + it.h) * T * HS + c0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = q0 + qrow * 16 + gr + 8 * r;
          if (row >= T) continue;
          float* d = dqh + (size_t)row * HS + 2 * t4;
#pragma unroll
          for (int n = 0; n < NCQ / 8; ++n)
            atomic_add2(d + 8 * n, dq[n][2 * r], dq[n][2 * r + 1]);
        }
      }
    }
    __syncthreads();
  }
  float* base = dqkv ? dqkv + (size_t)b * T * ld : nullptr;
  uint16_t* base16 = dqkv16 ? dqkv16 + (size_t)b * T * ld : nullptr;
  if (SP) {  // split: [2][B, K, T, HS] accumulators (k_kv_out writes them)
    float* dka = dkv_acc + ((size_t)b * p.K + g) * T * HS + dpart * HC;
#pragma unroll
    for (int mt = 0; mt < KMT; ++mt) {
      atomic_rows<HS, HC>(dk[mt], dka, kw + mt * 16, T, lane);
      atomic_rows<HS, HC>(dv[mt], dka + (size_t)gridDim.z * p.K * T * HS, kw + mt * 16, T, lane);
    }
    return;
  }
  const int ko = (p.H + g) * HS + dpart * HC, vo = (p.H + p.K + g) * HS + dpart * HC;
#pragma unroll
  for (int mt = 0; mt < KMT; ++mt) {
    add_rows<BF, HC>(dk[mt], base ? base + ko : nullptr, base16 ? base16 + ko : nullptr, ld, kw + mt * 16, T, lane,
                     p.scale, acc);
    add_rows<BF, HC>(dv[mt], base ? base + vo : nullptr, base16 ? base16 + vo : nullptr, ld, kw + mt * 16, T, lane, 1.f,
                     acc);
  }
}

// The accumulated dQ [B, H, T, HS] (times the scale) into the qkv gradient's q part: eight elements a thread.
template <bool BF, int HS>
__global__ void k_dq_out(const float* dq_acc, float* dqkv, uint16_t* dqkv16, int B, TcDims p, bool acc) {
  const int64_t n8 = (int64_t)B * p.H * p.T * (HS / 8);
  const float sc = p.scale;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / (HS / 8), bh = row / p.T;  // row = (b * H + h) * T + t
    const int t = (int)(row % p.T), hh = (int)(bh % p.H), bb = (int)(bh / p.H), c8 = (int)(i % (HS / 8)) * 8;
    float v[8];
    ld8<BF>(dq_acc + i * 8, v);
    const size_t off = ((size_t)bb * p.T + t) * p.W + hh * HS + c8;
    if (dqkv16) {
      uint4 u;
      u.x = pack2<BF>(v[0] * sc, v[1] * sc), u.y = pack2<BF>(v[2] * sc, v[3] * sc);
      u.z = pack2<BF>(v[4] * sc, v[5] * sc), u.w = pack2<BF>(v[6] * sc, v[7] * sc);
      *reinterpret_cast<uint4*>(dqkv16 + off) = u;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) dqkv[off + k] = (acc ? dqkv[off + k] : 0.f) + v[k] * sc;
    }
  }
}

// The split key-block backward's dK, dV accumulators [2][B, K, T, HS] (dK times the scale) into the qkv gradient.
template <bool BF, int HS>
__global__ void k_kv_out(const float* dkv_acc, float* dqkv, uint16_t* dqkv16, int B, TcDims p, bool acc) {
  const int64_t n8 = (int64_t)B * p.K * p.T * (HS / 8);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < 2 * n8; i += (int64_t)gridDim.x * blockDim.x) {
    const int part = i >= n8;                                             // 0: dK, 1: dV
    const int64_t j = i - part * n8, row = j / (HS / 8), bg = row / p.T;  // row = (b * K + g) * T + t
    const int t = (int)(row % p.T), gg = (int)(bg % p.K), bb = (int)(bg / p.K), c8 = (int)(j % (HS / 8)) * 8;
    const float sc = part ? 1.f : p.scale;
    float v[8];
    ld8<BF>(dkv_acc + i * 8, v);
    const size_t off = ((size_t)bb * p.T + t) * p.W + (p.H + part * p.K + gg) * HS + c8;
    if (dqkv16) {
      uint4 u;
      u.x = pack2<BF>(v[0] * sc, v[1] * sc), u.y = pack2<BF>(v[2] * sc, v[3] * sc);
      u.z = pack2<BF>(v[4] * sc, v[5] * sc), u.w = pack2<BF>(v[6] * sc, v[7] * sc);
      *reinterpret_cast<uint4*>(dqkv16 + off) = u;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) dqkv[off + k] = (acc ? dqkv[off + k] : 0.f) + v[k] * sc;
    }
  }
}

// ---- backward: dQ per query block ------------------------------------------------------
template <int HS>
constexpr size_t kQSmem = 2 * (size_t)(6 * TileOf<HS>);  // Q, dO; double-buffered K, V

// QF: the warp's Q and dO fragments read once into registers (else from shared memory every key tile).
template <bool BF, int HS, bool QF, int MB, bool OPT>
__global__ void __launch_bounds__(32 * kWarps, MB)
    k_bwd_q(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
            uint16_t* dqkv16, TcDims p, bool acc) {
  constexpr int LD = LDof<HS>, TILE = TileOf<HS>;
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Qs = sm;
  uint16_t* dOs = Qs + TILE;
  uint16_t* Ks = dOs + TILE;  // [2][BR][LD]
  uint16_t* Vs = Ks + 2 * TILE;
  const int T = p.T, window = OPT ? p.window : 0;
  const bool cap = OPT && p.cap;
  const int nt = (T + BR - 1) / BR, qt = nt - 1 - blockIdx.x;
  const int b = blockIdx.z, h = blockIdx.y, g = h / p.rep, q0 = qt * BR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int w0 = q0 + warp * 16;
  const int64_t ld = p.W;
  const uint16_t* xb = qkv + (size_t)b * T * ld;
  const uint16_t* qh = xb + h * HS;
  const uint16_t *kh = xb + (p.H + g) * HS, *vh = xb + (p.H + p.K + g) * HS;
  // OPT: the first key each of this lane's two rows sees (T past T), the least and largest over the warp's rows, and
  // the block's least (its first key tile).
  int fr[2], wmin = 0, wmax = 0, j0 = 0;
  if constexpr (OPT) {
    __shared__ int bmin[kWarps];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tq = w0 + gr + 8 * r;
      fr[r] = tq < T ? first_key(p, window, b, tq) : T;
    }
    wmin = __reduce_min_sync(0xffffffffu, min(fr[0], fr[1]));
    wmax = __reduce_max_sync(0xffffffffu, max(fr[0], fr[1]));
    if (lane == 0) bmin[warp] = wmin;
    __syncthreads();
    j0 = min(min(bmin[0], bmin[1]), min(bmin[2], bmin[3])) / BR;
  }
  load_tile<HS>(Qs, qh, ld, q0, T);
  load_tile<HS>(dOs, dout + (size_t)b * T * p.O + h * HS, p.O, q0, T);
  load_tile<HS>(Ks, kh, ld, j0 * BR, T);
  load_tile<HS>(Vs, vh, ld, j0 * BR, T);
  cp_commit();
  float Lr[2], Dr[2];  // this lane's two rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tq = w0 + gr + 8 * r;
    Lr[r] = tq < T ? lse[((size_t)b * p.H + h) * T + tq] * kLog2e : INFINITY;
    Dr[r] = tq < T ? delta[((size_t)b * p.H + h) * T + tq] : 0.f;
  }
  AccO<HS> dq;
  AccS s, dp;
  Frag<HS> qf, df;  // the warp's Q and dO rows (QF: read once; 113.9 vs 117.8 us a call at GPT-2 124M)
  zero(dq);
  for (int j = j0; j <= qt; ++j) {
    const int buf = (j - j0) & 1;
    if (j < qt) {
      load_tile<HS>(Ks + (buf ^ 1) * TILE, kh, ld, (j + 1) * BR, T);
      load_tile<HS>(Vs + (buf ^ 1) * TILE, vh, ld, (j + 1) * BR, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const uint16_t* Kb = Ks + buf * TILE;
    const int k0 = j * BR;
    if (QF && j == j0) {
      load_frag<HS>(qf, Qs + warp * 16 * LD, lane);
      load_frag<HS>(df, dOs + warp * 16 * LD, lane);
    }
    // Else every key of the tile is after all of the warp's queries, or before all of their first keys.
    if (k0 <= w0 + 15 && !(OPT && k0 + BR - 1 < wmin)) {
      if (!QF) load_frag<HS>(qf, Qs + warp * 16 * LD, lane);
      mm_abt<BF, HS>(s, qf, Kb, lane);  // S
      if (!QF) load_frag<HS>(df, dOs + warp * 16 * LD, lane);
      mm_abt<BF, HS>(dp, df, Vs + buf * TILE, lane);  // dP = dO V^T
      const bool masked_tile = k0 + BR - 1 > w0 || (OPT && k0 < wmax);
#pragma unroll
      for (int n = 0; n < BR / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const bool masked = masked_tile && hidden(w0 + gr + 8 * r, k0 + 8 * n + 2 * t4 + (e & 1), OPT ? fr[r] : 0);
          if (cap) {
            const float th = capped(s[n][e], p) * p.inv_post;
            dp[n][e] = masked ? 0.f : ex2(th * p.post - Lr[r]) * (dp[n][e] - Dr[r]) * (1.f - th * th);
          } else {
            dp[n][e] = masked ? 0.f : ex2(s[n][e] * p.qk - Lr[r]) * (dp[n][e] - Dr[r]);  // dS
          }
        }
      mm_pm<BF, HS>(dq, dp, Kb, lane);  // dQ += dS K
    }
    __syncthreads();
  }
  add_rows<BF, HS>(dq, dqkv ? dqkv + (size_t)b * T * ld + h * HS : nullptr,
                   dqkv16 ? dqkv16 + (size_t)b * T * ld + h * HS : nullptr, ld, w0, T, lane, p.scale, acc);
}

template <typename K>
void opt_in_smem(K kernel, size_t bytes) {
  ZR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <bool BF, int HS, int MT, int NW, int KT, bool QR, int MB, bool LPT, bool OPT, bool PL>
void fwd_go(const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int B, const TcDims& p) {
  using Cfg = FwdCfg<HS, MT, NW, KT, QR, MB, PL>;
  static bool once = (opt_in_smem(k_fwd<BF, HS, MT, NW, KT, QR, MB, LPT, OPT, PL>, Cfg::smem), true);
  (void)once;
  dim3 grid((p.T + Cfg::BQ - 1) / Cfg::BQ, p.H, B);
  k_fwd<BF, HS, MT, NW, KT, QR, MB, LPT, OPT, PL>
      <<<grid, 32 * NW, Cfg::smem, cuda::stream()>>>(qkv, out, out16, lse, p);
  ZR_CUDA(cudaGetLastError());
}
// OPT: the variant with the window, soft-capping and documents where p asks for any (the sweep's tilings have none).
template <bool BF, int HS, int MT, int NW, int KT, bool QR = true, int MB = 0, bool LPT = false, bool OPT = false,
          bool PL = false>
void fwd_run(const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int B, const TcDims& p) {
  if (OPT && needs_opt(p))
    fwd_go<BF, HS, MT, NW, KT, QR, MB, LPT, OPT, PL>(qkv, out, out16, lse, B, p);
  else
    fwd_go<BF, HS, MT, NW, KT, QR, MB, LPT, false, PL>(qkv, out, out16, lse, B, p);
}

// The forward tilings the probe sweeps: {MT, NW, KT, Q in registers, blocks an SM}; 0 is the one training uses.
constexpr int kFwdCfgs64 = 13, kFwdCfgsN = 6;
template <bool BF>
void fwd_e(int cfg, int D, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int B, const TcDims& p) {
  ZR_CHECK(cfg == 0 || D != 64 || !needs_opt(p), "attention forward tiling ", cfg,
           " has no sliding window, soft-capping or documents (tiling 0 has)");
  if (D == 64) switch (cfg) {
      case 0:  // 63.7 us at GPT-2 124M's shape on the H200 (B 8, H 12, T 1024; SDPA 50-51 us, same call)
        return fwd_run<BF, 64, 2, 4, 64, false, 3, true, true>(qkv, out, out16, lse, B, p);
      case 1:  // 87.5 us
        return fwd_run<BF, 64, 2, 4, 64>(qkv, out, out16, lse, B, p);
      case 2:  // 94.3 us
        return fwd_run<BF, 64, 1, 8, 128>(qkv, out, out16, lse, B, p);
      case 3:  // 88.6 us
        return fwd_run<BF, 64, 2, 4, 64, false>(qkv, out, out16, lse, B, p);
      case 4:  // 86.3 us
        return fwd_run<BF, 64, 2, 4, 128, false>(qkv, out, out16, lse, B, p);
      case 5:  // 99.7 us (139 registers: one block an SM)
        return fwd_run<BF, 64, 1, 8, 64>(qkv, out, out16, lse, B, p);
      case 6:  // 89.7 us
        return fwd_run<BF, 64, 1, 4, 64, true, 4>(qkv, out, out16, lse, B, p);
      case 7:  // 86.7 us: tiling 0 in grid order
        return fwd_run<BF, 64, 2, 4, 64, false, 3>(qkv, out, out16, lse, B, p);
      case 8:  // 69.0 us: tiling 9, longest first
        return fwd_run<BF, 64, 1, 8, 64, true, 2, true>(qkv, out, out16, lse, B, p);
      case 9:  // 83.0 us (session 7's, with ex2.ftz)
        return fwd_run<BF, 64, 1, 8, 64, true, 2>(qkv, out, out16, lse, B, p);
      case 10:  // 71.2 us: longest first, 32 rows a warp, 4 warps, 128-key tiles, Q from shared memory, 2 blocks an SM
        return fwd_run<BF, 64, 2, 4, 128, false, 2, true>(qkv, out, out16, lse, B, p);
      case 11:  // 71.1 us: longest first, tiling 1 (Q in registers) sized for 2 blocks an SM
        return fwd_run<BF, 64, 2, 4, 64, true, 2, true>(qkv, out, out16, lse, B, p);
      case 12:  // 74.7 us: longest first, tiling 6
        return fwd_run<BF, 64, 1, 4, 64, true, 4, true>(qkv, out, out16, lse, B, p);
      default:
        break;
    }
  else if (cfg == 0 || cfg == 1) {
    const bool c0 = cfg == 0;
    switch (D) {
      case 80:
        return c0 ? fwd_run<BF, 80, 2, 4, 64, false, 2, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 80, 1, 4, 64, true, 0, true, true>(qkv, out, out16, lse, B, p);
      case 96:
        return c0 ? fwd_run<BF, 96, 2, 4, 64, false, 2, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 96, 1, 4, 64, true, 0, true, true>(qkv, out, out16, lse, B, p);
      case 128:
        return c0 ? fwd_run<BF, 128, 2, 4, 64, false, 1, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 128, 1, 4, 64, true, 0, true, true>(qkv, out, out16, lse, B, p);
      case 256:
        return c0 ? fwd_run<BF, 256, 1, 4, 32, true, 1, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 256, 1, 4, 64, false, 1, true, true>(qkv, out, out16, lse, B, p);
      default:
        break;
    }
  } else if (cfg == 2 || cfg == 3) {  // (probe only: no window, cap or documents)
    ZR_CHECK(!needs_opt(p), "attention forward tiling ", cfg, " has no sliding window, soft-capping or documents");
    const bool c2 = cfg == 2;
    switch (D) {
      case 80:
        return c2 ? fwd_run<BF, 80, 1, 8, 64, false, 0, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 80, 2, 4, 32, false, 2, true>(qkv, out, out16, lse, B, p);
      case 96:
        return c2 ? fwd_run<BF, 96, 1, 8, 64, false, 0, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 96, 2, 4, 32, false, 2, true>(qkv, out, out16, lse, B, p);
      case 128:
        return c2 ? fwd_run<BF, 128, 1, 8, 64, false, 0, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 128, 2, 4, 32, false, 2, true>(qkv, out, out16, lse, B, p);
      case 256:
        return c2 ? fwd_run<BF, 256, 1, 8, 32, false, 1, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 256, 1, 4, 32, false, 1, true>(qkv, out, out16, lse, B, p);
      default:
        break;
    }
  } else if (cfg == 4 || cfg == 5) {  // FlashAttention-2's pipeline (one K, one V buffer: PL)
    const bool c4 = cfg == 4;
    switch (D) {
      case 80:
        return c4 ? fwd_run<BF, 80, 2, 4, 64, false, 2, true, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 80, 1, 4, 64, true, 3, true, true, true>(qkv, out, out16, lse, B, p);
      case 96:
        return c4 ? fwd_run<BF, 96, 2, 4, 64, false, 2, true, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 96, 1, 4, 64, true, 3, true, true, true>(qkv, out, out16, lse, B, p);
      case 128:
        return c4 ? fwd_run<BF, 128, 2, 4, 64, false, 2, true, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 128, 1, 4, 64, true, 3, true, true, true>(qkv, out, out16, lse, B, p);
      case 256:
        return c4 ? fwd_run<BF, 256, 1, 4, 64, false, 2, true, true, true>(qkv, out, out16, lse, B, p)
                  : fwd_run<BF, 256, 1, 4, 64, true, 2, true, true, true>(qkv, out, out16, lse, B, p);
      default:
        break;
    }
  }
  ZR_FAIL("attention forward tiling ", cfg, " does not exist at head size ", D);
}
const char* fwd_name(int D, int cfg) {
  static const char* n64[kFwdCfgs64] = {"32 rows/warp, 4 warps, 64 keys, Q from smem, 3 blocks/SM, longest first",
                                        "32 rows/warp, 4 warps, 64 keys",
                                        "16 rows/warp, 8 warps, 128 keys",
                                        "32 rows/warp, 4 warps, 64 keys, Q from smem",
                                        "32 rows/warp, 4 warps, 128 keys, Q from smem",
                                        "16 rows/warp, 8 warps, 64 keys",
                                        "16 rows/warp, 4 warps, 64 keys, 4 blocks/SM regs",
                                        "32 rows/warp, 4 warps, 64 keys, Q from smem, 3 blocks/SM",
                                        "tiling 9, longest first",
                                        "16 rows/warp, 8 warps, 64 keys, 2 blocks/SM regs",
                                        "32 rows/warp, 4 warps, 128 keys, Q from smem, 2 blocks/SM, longest first",
                                        "32 rows/warp, 4 warps, 64 keys, 2 blocks/SM regs, longest first",
                                        "16 rows/warp, 4 warps, 64 keys, 4 blocks/SM regs, longest first"};
  if (D == 64) return cfg >= 0 && cfg < kFwdCfgs64 ? n64[cfg] : "?";
  if (D == 256)
    return cfg == 0   ? "16 rows/warp, 4 warps, 32 keys, Q in registers, longest first"
           : cfg == 1 ? "16 rows/warp, 4 warps, 64 keys, Q from smem, longest first"
           : cfg == 2 ? "16 rows/warp, 8 warps, 32 keys, Q from smem, longest first"
           : cfg == 3 ? "16 rows/warp, 4 warps, 32 keys, Q from smem, longest first"
           : cfg == 4 ? "FA2 pipeline (one K, one V buffer), 16 rows/warp, 4 warps, 64 keys, Q from smem, 2 blocks/SM"
           : cfg == 5 ? "FA2 pipeline, 16 rows/warp, 4 warps, 64 keys, Q in registers, 2 blocks/SM"
                      : "?";
  return cfg == 0   ? "32 rows/warp, 4 warps, 64 keys, Q from smem, longest first"
         : cfg == 1 ? "16 rows/warp, 4 warps, 64 keys, Q in registers, longest first"
         : cfg == 2 ? "16 rows/warp, 8 warps, 64 keys, Q from smem, longest first"
         : cfg == 3 ? "32 rows/warp, 4 warps, 32 keys, Q from smem, 2 blocks/SM, longest first"
         : cfg == 4 ? "FA2 pipeline (one K, one V buffer), 32 rows/warp, 4 warps, 64 keys, Q from smem, 2 blocks/SM"
         : cfg == 5 ? "FA2 pipeline, 16 rows/warp, 4 warps, 64 keys, Q in registers, 3 blocks/SM"
                    : "?";
}

// The one-kernel backward's variants the probe sweeps; 0 trains.
constexpr int kBwdCfgs64 = 8, kBwdCfgsN = 2, kBwdCfgs96 = 5, kBwdCfgs128 = 9, kBwdCfgs256 = 5;
// A one-kernel backward: blocks of KEYS keys (a (key blocks, K, B) grid) and WARPS warps, SMEM bytes of shared memory.
template <auto Kernel, int KEYS, size_t SMEM, int WARPS = kWarps>
void bwd_one(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dq_acc, float* dkv_acc, int B, const TcDims& p, bool acc) {
  static bool once = (opt_in_smem(Kernel, SMEM), true);
  (void)once;
  Kernel<<<dim3((p.T + KEYS - 1) / KEYS, p.K * p.split, B), 32 * WARPS, SMEM, cuda::stream()>>>(
      qkv, dout, lse, delta, dqkv, dqkv16, dq_acc, dkv_acc, p, acc);
  ZR_CUDA(cudaGetLastError());
}
template <bool BF, int HS, int MB, bool FX = true, bool LPT = false, int NB = 2, bool OPT = false, int CS = 1,
          bool SP = false, int KW = kWarps>
constexpr auto bwd_kv_dq =
    bwd_one<k_bwd_kv<BF, HS, true, MB, FX, LPT, NB, OPT, CS, SP, KW>, 16 * KW, kv_smem<HS, true, NB, KW>(), KW * CS>;
template <bool BF, int QH, bool KR, bool LPT = true, bool OPT = false, bool SP = false>
constexpr auto bwd_kv2 = bwd_one<k_bwd_kv2<BF, QH, KR, 2, LPT, OPT, SP>, KB2, kKv2Smem>;
// The one-kernel backward (longest first) at head size HS with NB Q / dO buffers, CS column parts and KW key warps:
// the variant with the options (opt) and / or the grouped-query split (sp).
template <bool BF, int HS, int MB, int NB, int CS, int KW>
auto* bwd_pick(bool opt, bool sp) {
  return opt ? (sp ? bwd_kv_dq<BF, HS, MB, true, true, NB, true, CS, true, KW>
                   : bwd_kv_dq<BF, HS, MB, true, true, NB, true, CS, false, KW>)
             : (sp ? bwd_kv_dq<BF, HS, MB, true, true, NB, false, CS, true, KW>
                   : bwd_kv_dq<BF, HS, MB, true, true, NB, false, CS, false, KW>);
}

// FlashAttention-2's layout (k_bwd_sd): KMT m16 tiles of keys a warp, WK key groups, NB Q / dO buffers, dQ in DQP
// passes; FULL: also the variants with the options (else they fail: probe-only candidates).
template <bool BF, int HS, int KMT, int WK, int NB, int DQP, bool FULL = true>
auto* bwd_sd_pick(bool opt, bool sp) {
  constexpr int KEYS = 16 * KMT * WK;
  constexpr size_t SM = sd_smem<HS, KEYS, NB>();
  if constexpr (FULL) {
    if (opt)
      return sp ? bwd_one<k_bwd_sd<BF, HS, KMT, WK, NB, DQP, true, true>, KEYS, SM, kSdWarps>
                : bwd_one<k_bwd_sd<BF, HS, KMT, WK, NB, DQP, true, false>, KEYS, SM, kSdWarps>;
  } else {
    ZR_CHECK(!opt, "attention backward variant (FlashAttention-2 layout, ", KEYS,
             " keys) has no sliding window, soft-capping or documents");
  }
  return sp ? bwd_one<k_bwd_sd<BF, HS, KMT, WK, NB, DQP, false, true>, KEYS, SM, kSdWarps>
            : bwd_one<k_bwd_sd<BF, HS, KMT, WK, NB, DQP, false, false>, KEYS, SM, kSdWarps>;
}

// The two kernels at head size HS (dK, dV per key block; dQ per query block): atomic-free, or (dkv_acc, p.split > 1)
// the key-block kernel split over the query heads of each key/value head, adding dK, dV with atomics.
// KW: the key-block kernel's key warps (8: 128-key blocks).
template <bool BF, int HS, int MBKV, int MBQ, int NB, bool QF, bool OPT, bool SP, int KW>
void bwd_two_go(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
                uint16_t* dqkv16, float* dkv_acc, int B, const TcDims& p, bool acc) {
  constexpr int CS = HS == 256 ? 2 : 1;  // (see k_bwd_kv)
  constexpr size_t kv = kv_smem<HS, false, NB, KW>(), q = kQSmem<HS>;
  static bool once = (opt_in_smem(k_bwd_kv<BF, HS, false, MBKV, true, false, NB, OPT, CS, SP, KW>, kv),
                      opt_in_smem(k_bwd_q<BF, HS, QF, MBQ, OPT>, q), true);
  (void)once;
  const int nt = (p.T + BR - 1) / BR, nkb = (p.T + 16 * KW - 1) / (16 * KW);
  k_bwd_kv<BF, HS, false, MBKV, true, false, NB, OPT, CS, SP, KW>
      <<<dim3(nkb, p.K * p.split, B), 32 * KW * CS, kv, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, dqkv16, nullptr,
                                                                          dkv_acc, p, acc);
  ZR_CUDA(cudaGetLastError());
  k_bwd_q<BF, HS, QF, MBQ, OPT>
      <<<dim3(nt, p.H, B), 32 * kWarps, q, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, dqkv16, p, acc);
  ZR_CUDA(cudaGetLastError());
}
template <bool BF, int HS, int KW = kWarps>
void bwd_two(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dkv_acc, int B, const TcDims& p, bool acc) {
  constexpr int MBKV = HS == 64 ? 3 : 1, MBQ = HS == 64 ? 3 : HS == 256 ? 1 : 2, NB = HS == 256 ? 1 : 2;
  constexpr bool QF = HS <= 96;
  const bool opt = needs_opt(p), sp = p.split > 1;
  auto* go = opt ? (sp ? bwd_two_go<BF, HS, MBKV, MBQ, NB, QF, true, true, KW>
                       : bwd_two_go<BF, HS, MBKV, MBQ, NB, QF, true, false, KW>)
                 : (sp ? bwd_two_go<BF, HS, MBKV, MBQ, NB, QF, false, true, KW>
                       : bwd_two_go<BF, HS, MBKV, MBQ, NB, QF, false, false, KW>);
  go(qkv, dout, lse, delta, dqkv, dqkv16, dkv_acc, B, p, acc);
}

// dq_acc non-null (the atomics path): [B, H, T, HS] for dQ, then [2][B, K, T, HS] for dK, dV where grouped-query
// heads split the key-block kernel over their query heads (every key/value head's work in one block leaves a
// grid of K heads: too few blocks, and a causal tail).
template <bool BF, int HS>
void bwd_h(const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse, const uint16_t* dout,
           float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc, int B, const TcDims& p0, int cfg,
           bool split) {
  const int64_t rows = (int64_t)B * p0.T * p0.H, kv_rows = (int64_t)B * p0.T * p0.K;
  const bool opt = needs_opt(p0);
  TcDims p = p0;
  float* dkv_acc = nullptr;
  if (dq_acc && p.rep > 1 && split) {
    p.split = p.rep;
    dkv_acc = dq_acc + rows * HS;
    ZR_CUDA(cudaMemsetAsync(dkv_acc, 0, sizeof(float) * (size_t)(2 * kv_rows * HS), cuda::stream()));
  }
  // Head size 128: the two kernels beat the one-kernel backward (1 block an SM for its shared memory): variant 0.
  const bool two = !dq_acc;
  if (!two) ZR_CUDA(cudaMemsetAsync(dq_acc, 0, sizeof(float) * (size_t)rows * HS, cuda::stream()));
  const unsigned dg = (unsigned)std::min<int64_t>((rows + 31) / 32, 1 << 16);  // 32 (row, head) pairs per block
  if (out16)
    k_delta<BF, HS, uint16_t><<<dg, 256, 0, cuda::stream()>>>(out16, dout, delta, B, p.T, p.H);
  else
    k_delta<BF, HS, float><<<dg, 256, 0, cuda::stream()>>>(out, dout, delta, B, p.T, p.H);
  ZR_CUDA(cudaGetLastError());
  if (two) {
    bwd_two<BF, HS>(qkv, dout, lse, delta, dqkv, dqkv16, dkv_acc, B, p, acc);
  } else {
    if constexpr (HS == 64) {
      ZR_CHECK(cfg == 0 || !opt, "attention backward variant ", cfg,
               " has no sliding window, soft-capping or documents (variant 0 has)");
      // Times: GPT-2 124M's shape on the H200 (B 8, H 12, T 1024), one probe call (session 9).
      const bool sp = p.split > 1;
      ZR_CHECK(cfg == 0 || !sp, "attention backward variant ", cfg, " has no grouped-query split (variant 0 has)");
      auto* run = opt ? (sp ? bwd_kv2<BF, 32, false, true, true, true> : bwd_kv2<BF, 32, false, true, true>)
                      : (sp ? bwd_kv2<BF, 32, false, true, false, true> : bwd_kv2<BF, 32, false>);
      switch (cfg) {
        case 0:  // 32 keys a warp (128 a block), 32 queries at a time, every head's longest key tile first: 190.9 us
          break;
        case 1:  // 16 keys a warp (64 a block), registers for three blocks an SM (at most 168), longest first: 223.7 us
          run = bwd_kv_dq<BF, 64, 3, true, true>;
          break;
        case 2:  // variant 1, the compiler's register choice (202: two blocks) in grid order: 259.1 us
          run = bwd_kv_dq<BF, 64, 1>;
          break;
        case 3:  // variant 1 with exp2f (the denormal-exact exponential) in grid order: 251.0 us
          run = bwd_kv_dq<BF, 64, 3, false>;
          break;
        case 4:  // variant 1 in grid order (each head's key tiles, one head after another): 249.3 us
          run = bwd_kv_dq<BF, 64, 3>;
          break;
        case 5:  // variant 0 with 16 queries at a time, K and V fragments in registers (255 registers, spills): 216.4
                 // us
          run = bwd_kv2<BF, 16, true>;
          break;
        case 6:  // variant 0 with 16 queries at a time: 206.1 us
          run = bwd_kv2<BF, 16, false>;
          break;
        case 7:  // variant 0 in grid order: 231.0 us
          run = bwd_kv2<BF, 32, false, false>;
          break;
        default:
          ZR_FAIL("attention backward variant ", cfg, " does not exist (0..", kBwdCfgs64 - 1, ")");
      }
      run(qkv, dout, lse, delta, dqkv, dqkv16, dq_acc, dkv_acc, B, p, acc);
    } else {
      constexpr int NCFG = HS == 128 ? kBwdCfgs128 : HS == 96 ? kBwdCfgs96 : HS == 256 ? kBwdCfgs256 : kBwdCfgsN;
      ZR_CHECK(cfg >= 0 && cfg < NCFG, "attention backward variant ", cfg, " does not exist at head size ", HS, " (0..",
               NCFG - 1, ")");
      // Longest first. 64-key blocks (16 keys a warp); head size 256: one Q / dO buffer (shared memory) and dK, dV's
      // columns split over two warps (no spills). 128-key blocks of 8 warps (every Q / dO tile and dQ atomic serves
      // 128 keys; dQ's columns over two warps, so not at 80, whose halves are not whole 16-column chunks).
      // H100 (B 4, H 16, T 2048, session 20): 80: 0 = 64-key blocks 0.719 ms, 1 = the two kernels 0.820. 96: 0 =
      // 128-key blocks 0.790, 1 = the two kernels 0.937, 2 = 64-key blocks 0.824. 128: 0 = 128-key blocks, one
      // Q / dO buffer 0.991, 1 = 64-key blocks 1.484, 2 = 64-key blocks, one buffer (two blocks an SM) 1.035, 3 =
      // 128-key blocks 1.013, 4 = the two kernels 1.172, 5 = the two kernels with 128-key blocks 1.201. 256: 0 =
      // 2.808, 1 = the two kernels 3.105.
      constexpr int MB = HS >= 128 ? 1 : 2, NB = HS == 256 ? 1 : 2, CS = HS == 256 ? 2 : 1;
      const bool sp = p.split > 1;
      auto* run = bwd_pick<BF, HS, MB, NB, CS, kWarps>(opt, sp);
      bool pair = cfg == 1, pair8 = false;  // the two kernels (dK, dV by atomics where split)
      // FlashAttention-2's layout (k_bwd_sd: P^T, dS^T through shared memory, 8 warps): 96: 3 = 128 keys (32 a
      // warp, 2 warps over the queries), 4 = 64 keys (16 a warp). 128: 6 = 128 keys, 7 = the same with one Q / dO
      // buffer, 8 = 64 keys. 256: 2 = 64 keys (32 a warp, 4 warps over the queries, dK / dV in column quarters), one
      // Q / dO buffer, 3 = the same with two, 4 = 64 keys of 16 a warp, column halves.
      if constexpr (HS == 96) {
        if (cfg == 0) run = bwd_pick<BF, HS, 1, 2, 1, 8>(opt, sp);
        if (cfg == 3) run = bwd_sd_pick<BF, HS, 2, 4, 2, 1>(opt, sp);
        if (cfg == 4) run = bwd_sd_pick<BF, HS, 1, 4, 2, 1, false>(opt, sp);
      } else if constexpr (HS == 128) {
        if (cfg == 0) run = bwd_pick<BF, HS, 1, 1, 1, 8>(opt, sp);
        if (cfg == 2) run = bwd_pick<BF, HS, MB, 1, CS, kWarps>(opt, sp);
        if (cfg == 3) run = bwd_pick<BF, HS, 1, 2, 1, 8>(opt, sp);
        if (cfg == 6) run = bwd_sd_pick<BF, HS, 2, 4, 2, 1>(opt, sp);
        if (cfg == 7) run = bwd_sd_pick<BF, HS, 2, 4, 1, 1, false>(opt, sp);
        if (cfg == 8) run = bwd_sd_pick<BF, HS, 1, 4, 2, 1, false>(opt, sp);
        pair = cfg == 4, pair8 = cfg == 5;
      } else if constexpr (HS == 256) {
        if (cfg == 2) run = bwd_sd_pick<BF, HS, 2, 2, 1, 2>(opt, sp);
        if (cfg == 3) run = bwd_sd_pick<BF, HS, 2, 2, 2, 2, false>(opt, sp);
        if (cfg == 4) run = bwd_sd_pick<BF, HS, 1, 4, 1, 2, false>(opt, sp);
      }
      if (pair) {
        bwd_two<BF, HS>(qkv, dout, lse, delta, dqkv, dqkv16, dkv_acc, B, p, acc);
      } else if (pair8) {
        bwd_two<BF, HS, HS == 128 ? 8 : kWarps>(qkv, dout, lse, delta, dqkv, dqkv16, dkv_acc, B, p, acc);
      } else {
        run(qkv, dout, lse, delta, dqkv, dqkv16, dq_acc, dkv_acc, B, p, acc);
        const unsigned og = (unsigned)std::min<int64_t>((rows * (HS / 8) + 255) / 256, 1 << 16);
        k_dq_out<BF, HS><<<og, 256, 0, cuda::stream()>>>(dq_acc, dqkv, dqkv16, B, p, acc);
        ZR_CUDA(cudaGetLastError());
      }
    }
    if constexpr (HS == 64) {
      const unsigned og = (unsigned)std::min<int64_t>((rows * (HS / 8) + 255) / 256, 1 << 16);
      k_dq_out<BF, HS><<<og, 256, 0, cuda::stream()>>>(dq_acc, dqkv, dqkv16, B, p, acc);
      ZR_CUDA(cudaGetLastError());
    }
  }
  if (dkv_acc) {
    const unsigned og = (unsigned)std::min<int64_t>((2 * kv_rows * (HS / 8) + 255) / 256, 1 << 16);
    k_kv_out<BF, HS><<<og, 256, 0, cuda::stream()>>>(dkv_acc, dqkv, dqkv16, B, p, acc);
    ZR_CUDA(cudaGetLastError());
  }
}

template <bool BF>
void bwd_e(int D, const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse, const uint16_t* dout,
           float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc, int B, const TcDims& p, int cfg,
           bool split) {
  switch (D) {
    case 64:
      return bwd_h<BF, 64>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, B, p, cfg, split);
    case 80:
      return bwd_h<BF, 80>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, B, p, cfg, split);
    case 96:
      return bwd_h<BF, 96>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, B, p, cfg, split);
    case 128:
      return bwd_h<BF, 128>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, B, p, cfg, split);
    case 256:
      return bwd_h<BF, 256>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, B, p, cfg, split);
    default:
      ZR_FAIL("tensor-core attention has no head size ", D);
  }
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool tc_head_size(int64_t D) { return D == 64 || D == 80 || D == 96 || D == 128 || D == 256; }

// A tuning knob for device calls (bench/attn_device.sh): ZERORUN_ATTN_FWD_TILING_D<D> and
// ZERORUN_ATTN_BWD_VARIANT_D<D> name the forward tiling and the backward variant that cfg 0 (the default, what
// training runs) stands for at head size D, so one call can run the tests and the training path on a candidate
// before it becomes the default here. Unset: the defaults above.
int env_default(bool fwd, int64_t D) {
  static const std::array<int, 10> v = [] {
    std::array<int, 10> a{};
    const int ds[5] = {64, 80, 96, 128, 256};
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 5; ++i) {
        const std::string name =
            std::string(f ? "ZERORUN_ATTN_FWD_TILING_D" : "ZERORUN_ATTN_BWD_VARIANT_D") + std::to_string(ds[i]);
        const char* e = std::getenv(name.c_str());
        a[f * 5 + i] = e && *e ? std::atoi(e) : 0;
      }
    return a;
  }();
  const int i = D == 64 ? 0 : D == 80 ? 1 : D == 96 ? 2 : D == 128 ? 3 : 4;
  return v[(fwd ? 5 : 0) + i];
}
}  // namespace

bool tc_supported(const AttnDims& d) {
  // The kernels index rows and tiles in 32-bit ints.
  return tc_head_size(d.D) && d.T * d.width() < (int64_t{1} << 31) && d.T < (int64_t{1} << 30);
}
const char* tc_head_sizes() { return "64, 80, 96, 128, 256"; }
int tc_forward_configs(int64_t head_size) { return head_size == 64 ? kFwdCfgs64 : kFwdCfgsN; }
int tc_backward_configs(int64_t head_size) {
  return head_size == 64    ? kBwdCfgs64
         : head_size == 128 ? kBwdCfgs128
         : head_size == 96  ? kBwdCfgs96
         : head_size == 256 ? kBwdCfgs256
                            : kBwdCfgsN;
}
const char* tc_forward_config_name(int64_t head_size, int cfg) { return fwd_name((int)head_size, cfg); }

void tc_forward(bool bf16, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, const AttnDims& d, int cfg) {
  ZR_CHECK(tc_supported(d), "tensor-core attention needs head size ", tc_head_sizes(), ", got ", d.D);
  ZR_CHECK(aligned(qkv, 16) && aligned(out ? (const void*)out : out16, 8),
           "tensor-core attention needs 16-byte aligned qkv and an 8-byte aligned output");
  if (d.B * d.T == 0) return;
  const TcDims p = tc_dims(d);
  if (cfg == 0) cfg = env_default(true, d.D);
  if (bf16)
    fwd_e<true>(cfg, (int)d.D, qkv, out, out16, lse, (int)d.B, p);
  else
    fwd_e<false>(cfg, (int)d.D, qkv, out, out16, lse, (int)d.B, p);
}

void tc_backward(bool bf16, const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse,
                 const uint16_t* dout, float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc,
                 const AttnDims& d, int cfg, bool gqa_split) {
  ZR_CHECK(tc_supported(d), "tensor-core attention needs head size ", tc_head_sizes(), ", got ", d.D);
  ZR_CHECK(aligned(qkv, 16) && aligned(dout, 16) && aligned(out ? (const void*)out : out16, 16),
           "tensor-core attention needs 16-byte aligned qkv, output and output gradient");
  if (d.B * d.T == 0) return;
  const TcDims p = tc_dims(d);
  if (cfg == 0 && dq_acc) cfg = env_default(false, d.D);
  if (bf16)
    bwd_e<true>((int)d.D, qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, (int)d.B, p, cfg, gqa_split);
  else
    bwd_e<false>((int)d.D, qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, (int)d.B, p, cfg, gqa_split);
}

}  // namespace zerorun::kernels::flash
