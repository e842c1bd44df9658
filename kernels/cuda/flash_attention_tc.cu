// Tensor-core causal flash attention for 16-bit runs (bf16 or fp16 operands,
// fp32 accumulation and softmax), head size 64, FlashAttention-2 style: raw
// mma.sync m16n8k16 with the scores, probabilities and outputs held in
// registers (the score accumulator fragment is re-packed in place as the next
// product's A operand), tiles fed by ldmatrix from padded shared memory and
// double-buffered with cp.async.
//
// The kernels read 16-bit qkv [B, T, 3C] and output gradient [B, T, C] where
// they lie (strided rows, no packed copies; rows past T are zero-filled in
// shared memory), write the output in f32 or 16 bits, and the qkv gradient
// added into / written over f32, or written in 16 bits. The softmax runs on
// exp2 of the scores times log2(e)/sqrt(64). The forward's tilings are swept by
// bench/attn_probe.cc (training uses 32 query rows a warp, 4 warps, 64-key
// tiles, Q re-read from shared memory). Blocks take every head's longest tile
// first (the causal tail wave then holds the short ones). The backward runs as
// FlashAttention-2's five products in one kernel per block of 128 keys (32 a
// warp; dK, dV in registers, dQ added into an f32 accumulator with atomics,
// once per query tile and key block); the atomic-free
// alternative (ZERORUN_ATTN_ATOMICS=0) is one kernel per key block and one per
// query block, seven products, the same bits every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_check.h"
#include "flash_attention.h"

namespace zerorun::kernels::flash {
namespace {

constexpr int HS = 64;           // head size
constexpr int kWarps = 4;        // warps per block, 16 rows each
constexpr int BR = 16 * kWarps;  // rows (queries or keys) a block owns = rows of a streamed tile
constexpr int LD = HS + 8;       // shared-memory row stride (elements): 144 B, ldmatrix conflict-free
constexpr int kTile = BR * LD;   // elements of one tile in shared memory
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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
// A ROWS x HS tile: rows r0 .. r0 + BR - 1 of a head (`g` = its row 0, rows `ld` elements apart) into shared
// memory (stride LD); rows at or past T are zeros.
template <int ROWS = BR>
__device__ inline void load_tile(uint16_t* s, const uint16_t* g, int64_t ld, int r0, int T) {
  for (int i = threadIdx.x; i < ROWS * (HS / 8); i += blockDim.x) {
    const int r = i / (HS / 8), c = (i % (HS / 8)) * 8;
    if (r0 + r < T)
      cp16(s + r * LD + c, g + (size_t)(r0 + r) * ld + c);
    else
      *reinterpret_cast<uint4*>(s + r * LD + c) = make_uint4(0, 0, 0, 0);
  }
}

using Acc = float[8][4];  // a warp's 16 x 64 fp32 tile: 8 n-tiles of m16n8 accumulator fragments

__device__ inline void zero(Acc& a) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[n][e] = 0.f;
}

using Frag = uint32_t[4][4];  // a warp's 16 x HS A operand in registers: 4 k-chunks of m16k16 fragments

// The A operand of 16 rows (shared, stride LD) into registers, read once for a whole kernel.
__device__ inline void load_frag(Frag& f, const uint16_t* A, int lane) {
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) ldsm4(f[kc], A + (lane & 15) * LD + kc * 16 + (lane >> 4) * 8);
}

// acc = A B^T: A = the warp's 16 rows (fragments), B = 64 rows (shared, stride LD), both 16 x / 64 x HS.
template <bool BF>
__device__ inline void mm_abt(Acc& acc, const Frag& a, const uint16_t* B, int lane) {
  zero(acc);
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldsm4(b, B + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
      mma<BF>(acc[2 * np], a[kc], b[0], b[1]);
      mma<BF>(acc[2 * np + 1], a[kc], b[2], b[3]);
    }
  }
}

// acc += A M_kc: A = one 16 x 16 fragment, M_kc = rows kc * 16 .. +15 of M (shared, stride LD) x HS columns.
template <bool BF>
__device__ inline void mm_a_rows(Acc& acc, const uint32_t (&a)[4], const uint16_t* M, int kc, int lane) {
#pragma unroll
  for (int np = 0; np < HS / 16; ++np) {
    uint32_t b[4];
    ldsm4_t(b, M + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 + (lane >> 4) * 8);
    mma<BF>(acc[2 * np], a, b[0], b[1]);
    mma<BF>(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// acc += P M: P = 16 x 64 in accumulator layout (rounded to 16 bits here), M = 64 x HS (shared, stride LD).
template <bool BF>
__device__ inline void mm_pm(Acc& acc, const Acc& p, const uint16_t* M, int lane) {
#pragma unroll
  for (int kc = 0; kc < BR / 16; ++kc) {
    const uint32_t a[4] = {pack2<BF>(p[2 * kc][0], p[2 * kc][1]), pack2<BF>(p[2 * kc][2], p[2 * kc][3]),
                           pack2<BF>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                           pack2<BF>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
    mm_a_rows<BF>(acc, a, M, kc, lane);
  }
}

// dst rows (this lane's two rows of the warp's 16, `row0` = the first one's global index; rows >= T skipped)
// += mul * acc; dst points at column 0 of the head in row 0, rows `ld` apart.
template <bool BF>
__device__ inline void add_rows(const Acc& acc, float* dst, uint16_t* dst16, int64_t ld, int row0, int T, int lane,
                                float mul, bool accumulate) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    if (r >= T) continue;
    if (dst16) {  // 16-bit gradient: written, never accumulated
      uint16_t* d = dst16 + (size_t)r * ld + 2 * t;
#pragma unroll
      for (int n = 0; n < 8; ++n)
        *reinterpret_cast<uint32_t*>(d + 8 * n) = pack2<BF>(mul * acc[n][2 * half], mul * acc[n][2 * half + 1]);
      continue;
    }
    float* d = dst + (size_t)r * ld + 2 * t;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
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

// delta[b, h, t] = sum_i dO[b, t, h, i] O[b, t, h, i]: eight lanes per (b, t, h), eight elements each (16-byte
// loads); a warp covers four consecutive (row, head) pairs. The loop is warp-uniform (the shuffles need all lanes).
template <bool BF, class O>
__global__ void k_delta(const O* out, const uint16_t* dout, float* delta, int B, int T, int C, int H) {
  const int64_t n = (int64_t)B * H * T, step = (int64_t)gridDim.x * blockDim.x / 8;
  const int lane = threadIdx.x & 31, sub = lane & 7;
  for (int64_t base = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32 * 4; base < n; base += step) {
    const int64_t w = base + lane / 8;  // (b * T + t) * H + h
    float s = 0.f;
    if (w < n) {
      const int64_t off = (w / H) * C + (w % H) * HS + 8 * sub;
      float o[8], d[8];
      ld8<BF>(out + off, o);
      ld8<BF>(dout + off, d);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += o[i] * d[i];
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

// ---- forward ------------------------------------------------------------------------
// Templated on the tiling (a sweep for bench/attn_probe.cc): MT m16 tiles of query rows per warp (MT = 2: every
// K / V fragment read from shared memory feeds two products), NW warps a block, KT keys a streamed tile, QR: the
// warp's Q fragments kept in registers (else re-read from shared memory every key tile, fewer registers), MB: the
// blocks an SM the registers are sized for (0: the compiler's choice). Training uses tiling 0 (fwd_e lists them).
constexpr int kFwdCfgs = 13;
constexpr float kQk = kLog2e / 8.f;  // scores -> log2 domain: log2(e) / sqrt(HS)
constexpr float kInvSqrtHs = 1.f / 8.f;

template <int MT, int NW, int KT, bool QR, int MB>
struct FwdCfg {
  static constexpr int BQ = 16 * MT * NW;                              // query rows a block
  static constexpr size_t smem = 2 * (size_t)(BQ * LD + 4 * KT * LD);  // Q + double-buffered K, V
  static constexpr int NT = KT / 8;                                    // n8 tiles of a score row
  static constexpr int kMinBlocks = MB > 0 ? MB : 1;
};

template <int NT>
using AccN = float[NT][4];

// acc[mt] = Q_mt K^T; K = NT * 8 rows (shared, stride LD). QR: Q_mt from the fragments qf, else from shared
// memory (Qw = the warp's first row, stride LD) one k-chunk at a time.
template <bool BF, int MT, int NT, bool QR>
__device__ inline void mm_qk(AccN<NT> (&acc)[MT], const Frag (&qf)[QR ? MT : 1], const uint16_t* Qw, const uint16_t* K,
                             int lane) {
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

// acc[mt] += P_mt V (P in accumulator layout, rounded to 16 bits here); V = NT * 8 rows.
template <bool BF, int MT, int NT>
__device__ inline void mm_pv(Acc (&acc)[MT], const AccN<NT> (&p)[MT], const uint16_t* V, int lane) {
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

template <bool BF, int MT, int NW, int KT, bool QR, int MB, bool LPT>
__global__ void __launch_bounds__(32 * NW, FwdCfg<MT, NW, KT, QR, MB>::kMinBlocks)
    k_fwd(const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int T, int C, int H) {
  using Cfg = FwdCfg<MT, NW, KT, QR, MB>;
  constexpr int BQ = Cfg::BQ, NT = Cfg::NT, QW = 16 * MT;
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Qs = sm;            // [BQ][LD]
  uint16_t* Ks = Qs + BQ * LD;  // [2][KT][LD]
  uint16_t* Vs = Ks + 2 * KT * LD;
  const int3 tile = tile_of_block<LPT>();
  const int nq = (T + BQ - 1) / BQ, qb = nq - 1 - tile.x;  // the longest rows first
  const int b = tile.z, h = tile.y, q0 = qb * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int w0 = q0 + warp * QW;  // the warp's first query row
  const int64_t ld = 3 * (int64_t)C;
  const uint16_t* qh = qkv + (size_t)b * T * ld + h * HS;
  const uint16_t *kh = qh + C, *vh = qh + 2 * C;
  const int nk = (min(T, q0 + BQ) + KT - 1) / KT;  // key tiles up to the block's last query
  load_tile<BQ>(Qs, qh, ld, q0, T);
  load_tile<KT>(Ks, kh, ld, 0, T);
  load_tile<KT>(Vs, vh, ld, 0, T);
  cp_commit();
  Frag qf[QR ? MT : 1];  // unused without QR
  Acc o[MT];
  AccN<NT> s[MT];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(o[mt]);
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  for (int j = 0; j < nk; ++j) {
    const int buf = j & 1;
    if (j + 1 < nk) {
      load_tile<KT>(Ks + (buf ^ 1) * KT * LD, kh, ld, (j + 1) * KT, T);
      load_tile<KT>(Vs + (buf ^ 1) * KT * LD, vh, ld, (j + 1) * KT, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (QR && j == 0)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_frag(qf[QR ? mt : 0], Qs + (warp * QW + mt * 16) * LD, lane);
    const int k0 = j * KT;
    if (k0 <= w0 + QW - 1) {  // else every key of the tile is after all of the warp's queries
      mm_qk<BF, MT, NT, QR>(s, qf, Qs + warp * QW * LD, Ks + buf * KT * LD, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (k0 + KT - 1 > w0 + mt * 16)  // the tile reaches past this m-tile's first query: mask key > query
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (k0 + 8 * n + 2 * t4 + (e & 1) > w0 + mt * 16 + g + 8 * (e >> 1)) s[mt][n][e] = -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mn = fmaxf(m[mt][r], mx * kQk);  // running max, log2 domain
          const float corr = ex2(m[mt][r] - mn);       // m = -inf on the first tile: 0
          m[mt][r] = mn;
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            s[mt][n][2 * r] = ex2(fmaf(s[mt][n][2 * r], kQk, -mn));
            s[mt][n][2 * r + 1] = ex2(fmaf(s[mt][n][2 * r + 1], kQk, -mn));
            sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
          }
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            o[mt][n][2 * r] *= corr;
            o[mt][n][2 * r + 1] *= corr;
          }
          l[mt][r] = l[mt][r] * corr + sum;  // this lane's part of the row sum
        }
      }
      mm_pv<BF, MT, NT>(o, s, Vs + buf * KT * LD, lane);
    }
    __syncthreads();  // the buffer is refilled in the next iteration
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int tq = w0 + mt * 16 + g + 8 * r;
      if (tq >= T) continue;
      const float inv = 1.f / lr;
      const size_t off = ((size_t)b * T + tq) * C + h * HS + 2 * t4;
      if (out16) {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<uint32_t*>(out16 + off + 8 * n) =
              pack2<BF>(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<float2*>(out + off + 8 * n) = make_float2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      }
      if (t4 == 0) lse[((size_t)b * H + h) * T + tq] = (m[mt][r] + log2f(lr)) * kLn2;
    }
}

// ---- backward: dK, dV per key block --------------------------------------------------
// Shared: K, V of the block; double-buffered Q, dO tiles and their rows' log2 lse / delta.
constexpr size_t kKvSmem = 2 * (size_t)(6 * kTile) + sizeof(float) * 4 * BR;

// Row terms of query tile `t0` into shared memory: L = lse * log2(e) (+inf past T: p = 0), D = delta (0 past T).
__device__ inline void load_row_terms(float* Ls, float* Ds, const float* lse, const float* delta, int t0, int T) {
  for (int i = threadIdx.x; i < BR; i += blockDim.x) {
    const int t = t0 + i;
    Ls[i] = t < T ? lse[t] * kLog2e : INFINITY;
    Ds[i] = t < T ? delta[t] : 0.f;
  }
}

// The key-block kernels' pipeline step for query tile j (in buffer `buf`): starts loading tile j + 1 (Q, dO,
// row terms) into the other buffer, then waits until tile j is in shared memory for the whole block.
__device__ inline void next_q_tile(uint16_t* Qs, uint16_t* dOs, float* Ls, float* Ds, int buf, const uint16_t* qh,
                                   const uint16_t* dh, const float* L, const float* Dl, int64_t ld, int C, int j,
                                   int nt, int T) {
  if (j + 1 < nt) {
    load_tile(Qs + (buf ^ 1) * kTile, qh, ld, (j + 1) * BR, T);
    load_tile(dOs + (buf ^ 1) * kTile, dh, C, (j + 1) * BR, T);
    cp_commit();
    load_row_terms(Ls + (buf ^ 1) * BR, Ds + (buf ^ 1) * BR, L, Dl, (j + 1) * BR, T);
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}

// dQ rows warp*16 .. +15 of the query tile starting at row q0: dS (queries x the block's KEYS keys; dS^T in shared
// memory, read transposed) times K (shared, KEYS rows), added into the f32 accumulator dqh [T, HS] with float2
// atomics; `acc` is the scratch tile.
template <bool BF, int KEYS>
__device__ inline void add_dq(Acc& acc, const uint16_t* dSs, const uint16_t* Ks, float* dqh, int q0, int T, int warp,
                              int lane) {
  zero(acc);
#pragma unroll
  for (int kc = 0; kc < KEYS / 16; ++kc) {
    uint32_t a[4];
    ldsm4_t(a, dSs + (kc * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + warp * 16 + ((lane >> 3) & 1) * 8);
    mm_a_rows<BF>(acc, a, Ks, kc, lane);
  }
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row >= T) continue;
    float* d = dqh + (size_t)row * HS + 2 * t4;
#pragma unroll
    for (int n = 0; n < 8; ++n)
      atomicAdd(reinterpret_cast<float2*>(d + 8 * n), make_float2(acc[n][2 * r], acc[n][2 * r + 1]));
  }
}

// DQ = false: dK and dV only (k_bwd_q computes dQ). DQ = true: FlashAttention-2's five products in this one kernel:
// each warp's dS^T rows go to shared memory, and the block's dQ for the query tile, dS K over its 64 keys, is
// added into an f32 accumulator [B, H, T, HS] with float2 atomics (k_dq_out writes it into the qkv gradient).
// Faster than k_bwd_kv<false> + k_bwd_q, but the order of the additions into dQ varies from run to run.
constexpr size_t kKvDqSmem = kKvSmem + 2 * (size_t)kTile;  // + the dS^T tile

template <bool BF, bool DQ, int MB = 3, bool FX = true, bool LPT = false>
__global__ void __launch_bounds__(32 * kWarps, MB)
    k_bwd_kv(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dq_acc, int T, int C, int H, bool acc) {
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Ks = sm;
  uint16_t* Vs = Ks + kTile;
  uint16_t* Qs = Vs + kTile;                                     // [2][BR][LD]
  uint16_t* dOs = Qs + 2 * kTile;                                // [2][BR][LD]
  uint16_t* dSs = dOs + 2 * kTile;                               // DQ: [BR keys][LD], dS^T of the query tile
  float* Ls = reinterpret_cast<float*>(dSs + (DQ ? kTile : 0));  // [2][BR]
  float* Ds = Ls + 2 * BR;                                       // [2][BR]
  const int3 tile = tile_of_block<LPT>();
  const int nt = (T + BR - 1) / BR, kt = tile.x;  // key tile 0 has the most query tiles
  const int b = tile.z, h = tile.y, k0 = kt * BR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int64_t ld = 3 * (int64_t)C;
  const uint16_t* qh = qkv + (size_t)b * T * ld + h * HS;
  const uint16_t* dh = dout + (size_t)b * T * C + h * HS;
  const float* L = lse + ((size_t)b * H + h) * T;
  const float* Dl = delta + ((size_t)b * H + h) * T;
  float* dqh = DQ ? dq_acc + ((size_t)b * H + h) * T * HS : nullptr;
  load_tile(Ks, qh + C, ld, k0, T);
  load_tile(Vs, qh + 2 * C, ld, k0, T);
  load_tile(Qs, qh, ld, k0, T);
  load_tile(dOs, dh, C, k0, T);
  cp_commit();
  load_row_terms(Ls, Ds, L, Dl, k0, T);
  Acc dk, dv, s, dp;
  Frag kf, vf;  // the warp's K and V rows (read from shared memory every tile: keeping them costs occupancy)
  zero(dk);
  zero(dv);
  for (int j = kt; j < nt; ++j) {
    const int buf = (j - kt) & 1;
    next_q_tile(Qs, dOs, Ls, Ds, buf, qh, dh, L, Dl, ld, C, j, nt, T);
    const uint16_t* Qb = Qs + buf * kTile;
    const uint16_t* dOb = dOs + buf * kTile;
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;
    load_frag(kf, Ks + warp * 16 * LD, lane);
    mm_abt<BF>(s, kf, Qb, lane);  // S^T (keys x queries)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * t4 + (e & 1);  // query within the tile
        const bool masked = j == kt && c < warp * 16 + g + 8 * (e >> 1);
        s[n][e] = masked ? 0.f : FX ? ex2(s[n][e] * kQk - Lb[c]) : exp2f(s[n][e] * kQk - Lb[c]);  // P^T
      }
    mm_pm<BF>(dv, s, dOb, lane);  // dV += P^T dO
    load_frag(vf, Vs + warp * 16 * LD, lane);
    mm_abt<BF>(dp, vf, dOb, lane);  // dP^T = V dO^T
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - Db[8 * n + 2 * t4 + (e & 1)]);  // dS^T
    mm_pm<BF>(dk, dp, Qb, lane);  // dK += dS^T Q (times 1/sqrt(hs) when written)
    if constexpr (DQ) {
#pragma unroll
      for (int half = 0; half < 2; ++half)  // dS^T rows (keys) into shared memory, rounded as the products use it
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + g + 8 * half) * LD + 8 * n + 2 * t4) =
              pack2<BF>(dp[n][2 * half], dp[n][2 * half + 1]);
      __syncthreads();
      add_dq<BF, BR>(s, dSs, Ks, dqh, j * BR, T, warp, lane);
    }
    __syncthreads();
  }
  float* base = dqkv ? dqkv + (size_t)b * T * ld + h * HS : nullptr;
  uint16_t* base16 = dqkv16 ? dqkv16 + (size_t)b * T * ld + h * HS : nullptr;
  add_rows<BF>(dk, base ? base + C : nullptr, base16 ? base16 + C : nullptr, ld, k0 + warp * 16, T, lane, kInvSqrtHs,
               acc);
  add_rows<BF>(dv, base ? base + 2 * C : nullptr, base16 ? base16 + 2 * C : nullptr, ld, k0 + warp * 16, T, lane, 1.f,
               acc);
}

// The one-kernel backward with two m16 tiles of keys a warp (32 keys a warp, 128 a block): every Q / dO fragment
// read from shared memory feeds two products, and each query tile's dQ (atomics) is added once per 128 keys
// rather than per 64. The 64-query tile is taken QH queries at a time (the score tiles of 32 x QH stay within the
// registers next to dK, dV's 32 x 64 each); KR: the warp's K and V fragments held in registers for the whole
// kernel (else re-read from shared memory every product).
constexpr int KB2 = 2 * BR;  // keys a block
constexpr size_t kKv2Smem = 2 * (size_t)(2 * KB2 * LD + 4 * kTile + KB2 * LD) + sizeof(float) * 4 * BR;

template <bool BF, int QH, bool KR, int MB, bool LPT>
__global__ void __launch_bounds__(32 * kWarps, MB)
    k_bwd_kv2(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
              uint16_t* dqkv16, float* dq_acc, int T, int C, int H, bool acc) {
  constexpr int NQ = QH / 8;  // n8 tiles of a score row
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Ks = sm;                                     // [KB2][LD]
  uint16_t* Vs = Ks + KB2 * LD;                          // [KB2][LD]
  uint16_t* Qs = Vs + KB2 * LD;                          // [2][BR][LD]
  uint16_t* dOs = Qs + 2 * kTile;                        // [2][BR][LD]
  uint16_t* dSs = dOs + 2 * kTile;                       // [KB2 keys][LD]: dS^T of the query tile
  float* Ls = reinterpret_cast<float*>(dSs + KB2 * LD);  // [2][BR]
  float* Ds = Ls + 2 * BR;                               // [2][BR]
  const int3 tile = tile_of_block<LPT>();
  const int nt = (T + BR - 1) / BR, kb = tile.x;  // key block 0 has the most query tiles
  const int b = tile.z, h = tile.y, k0 = kb * KB2, j0 = 2 * kb;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int kw = k0 + warp * 32;  // the warp's first key
  const int64_t ld = 3 * (int64_t)C;
  const uint16_t* qh = qkv + (size_t)b * T * ld + h * HS;
  const uint16_t* dh = dout + (size_t)b * T * C + h * HS;
  const float* L = lse + ((size_t)b * H + h) * T;
  const float* Dl = delta + ((size_t)b * H + h) * T;
  float* dqh = dq_acc + ((size_t)b * H + h) * T * HS;
  load_tile<KB2>(Ks, qh + C, ld, k0, T);
  load_tile<KB2>(Vs, qh + 2 * C, ld, k0, T);
  load_tile(Qs, qh, ld, j0 * BR, T);
  load_tile(dOs, dh, C, j0 * BR, T);
  cp_commit();
  load_row_terms(Ls, Ds, L, Dl, j0 * BR, T);
  Acc dk[2], dv[2];
  Frag kf[KR ? 2 : 1], vf[KR ? 2 : 1];  // unused without KR
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) zero(dk[mt]), zero(dv[mt]);
  for (int j = j0; j < nt; ++j) {
    const int buf = (j - j0) & 1;
    next_q_tile(Qs, dOs, Ls, Ds, buf, qh, dh, L, Dl, ld, C, j, nt, T);
    if (KR && j == j0)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        load_frag(kf[KR ? mt : 0], Ks + (warp * 32 + mt * 16) * LD, lane);
        load_frag(vf[KR ? mt : 0], Vs + (warp * 32 + mt * 16) * LD, lane);
      }
    const uint16_t* Qb = Qs + buf * kTile;
    const uint16_t* dOb = dOs + buf * kTile;
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;
#pragma unroll
    for (int hf = 0; hf < BR / QH; ++hf) {
      const int q0 = j * BR + hf * QH;  // the part's first query
      AccN<NQ> s[2], dp[2];             // P^T, then dS^T (the warp's 32 keys x QH queries)
      if (q0 + QH - 1 < kw) {           // every query before every key of the warp: all masked
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[mt][n][e] = 0.f;
      } else {
        const uint16_t* Qh = Qb + hf * QH * LD;
        const uint16_t* dOh = dOb + hf * QH * LD;
        mm_qk<BF, 2, NQ, KR>(s, kf, Ks + warp * 32 * LD, Qh, lane);  // S^T = K Q^T
        const bool diag = q0 < kw + 31;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = hf * QH + 8 * n + 2 * t4 + (e & 1);  // query within the tile
              const bool masked = diag && j * BR + c < kw + mt * 16 + g + 8 * (e >> 1);
              s[mt][n][e] = masked ? 0.f : ex2(s[mt][n][e] * kQk - Lb[c]);  // P^T
            }
        mm_pv<BF, 2, NQ>(dv, s, dOh, lane);                            // dV += P^T dO
        mm_qk<BF, 2, NQ, KR>(dp, vf, Vs + warp * 32 * LD, dOh, lane);  // dP^T = V dO^T
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - Db[hf * QH + 8 * n + 2 * t4 + (e & 1)]);  // dS^T
        mm_pv<BF, 2, NQ>(dk, dp, Qh, lane);  // dK += dS^T Q (times 1/sqrt(hs) when written)
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)  // dS^T rows (keys) into shared memory, rounded as the products use it
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
            *reinterpret_cast<uint32_t*>(dSs + (warp * 32 + mt * 16 + g + 8 * r) * LD + hf * QH + 8 * n + 2 * t4) =
                pack2<BF>(dp[mt][n][2 * r], dp[mt][n][2 * r + 1]);
    }
    __syncthreads();
    Acc dq;
    add_dq<BF, KB2>(dq, dSs, Ks, dqh, j * BR, T, warp, lane);
    __syncthreads();
  }
  float* base = dqkv ? dqkv + (size_t)b * T * ld + h * HS : nullptr;
  uint16_t* base16 = dqkv16 ? dqkv16 + (size_t)b * T * ld + h * HS : nullptr;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    add_rows<BF>(dk[mt], base ? base + C : nullptr, base16 ? base16 + C : nullptr, ld, kw + mt * 16, T, lane,
                 kInvSqrtHs, acc);
    add_rows<BF>(dv[mt], base ? base + 2 * C : nullptr, base16 ? base16 + 2 * C : nullptr, ld, kw + mt * 16, T, lane,
                 1.f, acc);
  }
}

// The accumulated dQ [B, H, T, HS] (times 1/sqrt(hs)) into the qkv gradient's q part: eight elements a thread.
template <bool BF>
__global__ void k_dq_out(const float* dq_acc, float* dqkv, uint16_t* dqkv16, int B, int T, int C, int H, bool acc) {
  const int64_t n8 = (int64_t)B * H * T * (HS / 8);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / (HS / 8), bh = row / T;  // row = (b * H + h) * T + t
    const int t = (int)(row % T), hh = (int)(bh % H), bb = (int)(bh / H), c8 = (int)(i % (HS / 8)) * 8;
    float v[8];
    ld8<BF>(dq_acc + i * 8, v);
    const size_t off = ((size_t)bb * T + t) * 3 * C + hh * HS + c8;
    if (dqkv16) {
      uint4 u;
      u.x = pack2<BF>(v[0] * kInvSqrtHs, v[1] * kInvSqrtHs), u.y = pack2<BF>(v[2] * kInvSqrtHs, v[3] * kInvSqrtHs);
      u.z = pack2<BF>(v[4] * kInvSqrtHs, v[5] * kInvSqrtHs), u.w = pack2<BF>(v[6] * kInvSqrtHs, v[7] * kInvSqrtHs);
      *reinterpret_cast<uint4*>(dqkv16 + off) = u;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) dqkv[off + k] = (acc ? dqkv[off + k] : 0.f) + v[k] * kInvSqrtHs;
    }
  }
}

// ---- backward: dQ per query block ------------------------------------------------------
constexpr size_t kQSmem = 2 * (size_t)(6 * kTile);  // Q, dO; double-buffered K, V

template <bool BF>
__global__ void __launch_bounds__(32 * kWarps, 3)
    k_bwd_q(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
            uint16_t* dqkv16, int T, int C, int H, bool acc) {
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* Qs = sm;
  uint16_t* dOs = Qs + kTile;
  uint16_t* Ks = dOs + kTile;  // [2][BR][LD]
  uint16_t* Vs = Ks + 2 * kTile;
  const int nt = (T + BR - 1) / BR, qt = nt - 1 - blockIdx.x;
  const int b = blockIdx.z, h = blockIdx.y, q0 = qt * BR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int64_t ld = 3 * (int64_t)C;
  const uint16_t* qh = qkv + (size_t)b * T * ld + h * HS;
  const uint16_t *kh = qh + C, *vh = qh + 2 * C;
  load_tile(Qs, qh, ld, q0, T);
  load_tile(dOs, dout + (size_t)b * T * C + h * HS, C, q0, T);
  load_tile(Ks, kh, ld, 0, T);
  load_tile(Vs, vh, ld, 0, T);
  cp_commit();
  float Lr[2], Dr[2];  // this lane's two rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tq = q0 + warp * 16 + g + 8 * r;
    Lr[r] = tq < T ? lse[((size_t)b * H + h) * T + tq] * kLog2e : INFINITY;
    Dr[r] = tq < T ? delta[((size_t)b * H + h) * T + tq] : 0.f;
  }
  Acc dq, s, dp;
  Frag qf, df;  // the warp's Q and dO rows, read once (113.9 vs 117.8 us a call at GPT-2 124M)
  zero(dq);
  for (int j = 0; j <= qt; ++j) {
    const int buf = j & 1;
    if (j < qt) {
      load_tile(Ks + (buf ^ 1) * kTile, kh, ld, (j + 1) * BR, T);
      load_tile(Vs + (buf ^ 1) * kTile, vh, ld, (j + 1) * BR, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const uint16_t* Kb = Ks + buf * kTile;
    if (j == 0) {
      load_frag(qf, Qs + warp * 16 * LD, lane);
      load_frag(df, dOs + warp * 16 * LD, lane);
    }
    mm_abt<BF>(s, qf, Kb, lane);                 // S
    mm_abt<BF>(dp, df, Vs + buf * kTile, lane);  // dP = dO V^T
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const bool masked = j == qt && 8 * n + 2 * t4 + (e & 1) > warp * 16 + g + 8 * r;
        dp[n][e] = masked ? 0.f : ex2(s[n][e] * kQk - Lr[r]) * (dp[n][e] - Dr[r]);  // dS
      }
    mm_pm<BF>(dq, dp, Kb, lane);  // dQ += dS K
    __syncthreads();
  }
  add_rows<BF>(dq, dqkv ? dqkv + (size_t)b * T * ld + h * HS : nullptr,
               dqkv16 ? dqkv16 + (size_t)b * T * ld + h * HS : nullptr, ld, q0 + warp * 16, T, lane, kInvSqrtHs, acc);
}

template <typename K>
void opt_in_smem(K kernel, size_t bytes) {
  ZR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <bool BF, int MT, int NW, int KT, bool QR = true, int MB = 0, bool LPT = false>
void fwd_run(const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int B, int T, int C, int H) {
  using Cfg = FwdCfg<MT, NW, KT, QR, MB>;
  static bool once = (opt_in_smem(k_fwd<BF, MT, NW, KT, QR, MB, LPT>, Cfg::smem), true);
  (void)once;
  dim3 grid((T + Cfg::BQ - 1) / Cfg::BQ, H, B);
  k_fwd<BF, MT, NW, KT, QR, MB, LPT><<<grid, 32 * NW, Cfg::smem, cuda::stream()>>>(qkv, out, out16, lse, T, C, H);
  ZR_CUDA(cudaGetLastError());
}

// The forward tilings the probe sweeps: {MT, NW, KT, Q in registers, blocks an SM}; 0 is the one training uses.
template <bool BF>
void fwd_e(int cfg, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, int B, int T, int C, int H) {
  switch (cfg) {
    case 0:  // 63.7 us at GPT-2 124M's shape on the H200 (B 8, H 12, T 1024; SDPA 50-51 us, same call)
      return fwd_run<BF, 2, 4, 64, false, 3, true>(qkv, out, out16, lse, B, T, C, H);
    case 1:  // 87.5 us
      return fwd_run<BF, 2, 4, 64>(qkv, out, out16, lse, B, T, C, H);
    case 2:  // 94.3 us
      return fwd_run<BF, 1, 8, 128>(qkv, out, out16, lse, B, T, C, H);
    case 3:  // 88.6 us
      return fwd_run<BF, 2, 4, 64, false>(qkv, out, out16, lse, B, T, C, H);
    case 4:  // 86.3 us
      return fwd_run<BF, 2, 4, 128, false>(qkv, out, out16, lse, B, T, C, H);
    case 5:  // 99.7 us (139 registers: one block an SM)
      return fwd_run<BF, 1, 8, 64>(qkv, out, out16, lse, B, T, C, H);
    case 6:  // 89.7 us
      return fwd_run<BF, 1, 4, 64, true, 4>(qkv, out, out16, lse, B, T, C, H);
    case 7:  // 86.7 us: tiling 0 in grid order
      return fwd_run<BF, 2, 4, 64, false, 3>(qkv, out, out16, lse, B, T, C, H);
    case 8:  // 69.0 us: tiling 9, longest first
      return fwd_run<BF, 1, 8, 64, true, 2, true>(qkv, out, out16, lse, B, T, C, H);
    case 9:  // 83.0 us (session 7's, with ex2.ftz)
      return fwd_run<BF, 1, 8, 64, true, 2>(qkv, out, out16, lse, B, T, C, H);
    case 10:  // 71.2 us: longest first, 32 rows a warp, 4 warps, 128-key tiles, Q from shared memory, 2 blocks an SM
      return fwd_run<BF, 2, 4, 128, false, 2, true>(qkv, out, out16, lse, B, T, C, H);
    case 11:  // 71.1 us: longest first, tiling 1 (Q in registers) sized for 2 blocks an SM
      return fwd_run<BF, 2, 4, 64, true, 2, true>(qkv, out, out16, lse, B, T, C, H);
    case 12:  // 74.7 us: longest first, tiling 6
      return fwd_run<BF, 1, 4, 64, true, 4, true>(qkv, out, out16, lse, B, T, C, H);
    default:
      ZR_FAIL("attention forward tiling ", cfg, " does not exist (0..", kFwdCfgs - 1, ")");
  }
}

// The one-kernel backward's variants the probe sweeps; 0 trains.
constexpr int kBwdCfgs = 8;
// A one-kernel backward: blocks of KEYS keys (a (key blocks, H, B) grid), SMEM bytes of shared memory.
template <auto Kernel, int KEYS, size_t SMEM>
void bwd_one(const uint16_t* qkv, const uint16_t* dout, const float* lse, const float* delta, float* dqkv,
             uint16_t* dqkv16, float* dq_acc, int B, int T, int C, int H, bool acc) {
  static bool once = (opt_in_smem(Kernel, SMEM), true);
  (void)once;
  Kernel<<<dim3((T + KEYS - 1) / KEYS, H, B), 32 * kWarps, SMEM, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, dqkv16,
                                                                                   dq_acc, T, C, H, acc);
  ZR_CUDA(cudaGetLastError());
}
template <bool BF, int MB, bool FX = true, bool LPT = false>
constexpr auto bwd_kv_dq = bwd_one<k_bwd_kv<BF, true, MB, FX, LPT>, BR, kKvDqSmem>;
template <bool BF, int QH, bool KR, bool LPT = true>
constexpr auto bwd_kv2 = bwd_one<k_bwd_kv2<BF, QH, KR, 2, LPT>, KB2, kKv2Smem>;

template <bool BF>
void bwd_e(const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse, const uint16_t* dout,
           float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc, int B, int T, int C, int H, int cfg) {
  static bool once = (opt_in_smem(k_bwd_kv<BF, false>, kKvSmem), opt_in_smem(k_bwd_q<BF>, kQSmem), true);
  (void)once;
  const int64_t rows = (int64_t)B * T * H;
  if (dq_acc) ZR_CUDA(cudaMemsetAsync(dq_acc, 0, sizeof(float) * (size_t)rows * HS, cuda::stream()));
  const unsigned dg = (unsigned)std::min<int64_t>((rows + 31) / 32, 1 << 16);  // 32 (row, head) pairs per block
  if (out16)
    k_delta<BF, uint16_t><<<dg, 256, 0, cuda::stream()>>>(out16, dout, delta, B, T, C, H);
  else
    k_delta<BF, float><<<dg, 256, 0, cuda::stream()>>>(out, dout, delta, B, T, C, H);
  ZR_CUDA(cudaGetLastError());
  if (dq_acc) {
    // Times: GPT-2 124M's shape on the H200 (B 8, H 12, T 1024), one probe call (session 9).
    auto* run = bwd_kv2<BF, 32, false>;
    switch (cfg) {
      case 0:  // 32 keys a warp (128 a block), 32 queries at a time, every head's longest key tile first: 190.9 us
        break;
      case 1:  // 16 keys a warp (64 a block), registers for three blocks an SM (at most 168), longest first: 223.7 us
        run = bwd_kv_dq<BF, 3, true, true>;
        break;
      case 2:  // variant 1, the compiler's register choice (202: two blocks) in grid order: 259.1 us
        run = bwd_kv_dq<BF, 1>;
        break;
      case 3:  // variant 1 with exp2f (the denormal-exact exponential) in grid order: 251.0 us
        run = bwd_kv_dq<BF, 3, false>;
        break;
      case 4:  // variant 1 in grid order (each head's key tiles, one head after another): 249.3 us
        run = bwd_kv_dq<BF, 3>;
        break;
      case 5:  // variant 0 with 16 queries at a time, K and V fragments in registers (255 registers, spills): 216.4 us
        run = bwd_kv2<BF, 16, true>;
        break;
      case 6:  // variant 0 with 16 queries at a time: 206.1 us
        run = bwd_kv2<BF, 16, false>;
        break;
      case 7:  // variant 0 in grid order: 231.0 us
        run = bwd_kv2<BF, 32, false, false>;
        break;
      default:
        ZR_FAIL("attention backward variant ", cfg, " does not exist (0..", kBwdCfgs - 1, ")");
    }
    run(qkv, dout, lse, delta, dqkv, dqkv16, dq_acc, B, T, C, H, acc);
    const unsigned og = (unsigned)std::min<int64_t>((rows * (HS / 8) + 255) / 256, 1 << 16);
    k_dq_out<BF><<<og, 256, 0, cuda::stream()>>>(dq_acc, dqkv, dqkv16, B, T, C, H, acc);
    ZR_CUDA(cudaGetLastError());
    return;
  }
  const dim3 grid((T + BR - 1) / BR, H, B);
  k_bwd_kv<BF, false>
      <<<grid, 32 * kWarps, kKvSmem, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, dqkv16, nullptr, T, C, H, acc);
  ZR_CUDA(cudaGetLastError());
  k_bwd_q<BF><<<grid, 32 * kWarps, kQSmem, cuda::stream()>>>(qkv, dout, lse, delta, dqkv, dqkv16, T, C, H, acc);
  ZR_CUDA(cudaGetLastError());
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace

bool tc_supported(const AttnDims& d) {
  return d.D == HS && d.K == d.H && d.window == 0 && d.softcap == 0.f && d.scale == kInvSqrtHs;
}
const char* tc_head_sizes() { return "64"; }
int tc_forward_configs(int64_t) { return kFwdCfgs; }
int tc_backward_configs(int64_t) { return kBwdCfgs; }
const char* tc_forward_config_name(int64_t, int cfg) {
  static const char* names[kFwdCfgs] = {"32 rows/warp, 4 warps, 64 keys, Q from smem, 3 blocks/SM, longest first",
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
  return cfg >= 0 && cfg < kFwdCfgs ? names[cfg] : "?";
}

void tc_forward(bool bf16, const uint16_t* qkv, float* out, uint16_t* out16, float* lse, const AttnDims& d, int cfg) {
  ZR_CHECK(tc_supported(d), "tensor-core attention needs head size ", HS, ", got ", d.D);
  ZR_CHECK(aligned(qkv, 16) && aligned(out ? (const void*)out : out16, 8),
           "tensor-core attention needs 16-byte aligned qkv and an 8-byte aligned output");
  const int64_t B = d.B, T = d.T, C = d.H * d.D, H = d.H;
  if (B * T == 0) return;
  if (bf16)
    fwd_e<true>(cfg, qkv, out, out16, lse, (int)B, (int)T, (int)C, (int)H);
  else
    fwd_e<false>(cfg, qkv, out, out16, lse, (int)B, (int)T, (int)C, (int)H);
}

void tc_backward(bool bf16, const uint16_t* qkv, const float* out, const uint16_t* out16, const float* lse,
                 const uint16_t* dout, float* dqkv, uint16_t* dqkv16, bool acc, float* delta, float* dq_acc,
                 const AttnDims& d, int cfg) {
  ZR_CHECK(tc_supported(d), "tensor-core attention needs head size ", HS, ", got ", d.D);
  ZR_CHECK(aligned(qkv, 16) && aligned(dout, 16) && aligned(out ? (const void*)out : out16, 16),
           "tensor-core attention needs 16-byte aligned qkv, output and output gradient");
  const int64_t B = d.B, T = d.T, C = d.H * d.D, H = d.H;
  if (B * T == 0) return;
  if (bf16)
    bwd_e<true>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, (int)B, (int)T, (int)C, (int)H, cfg);
  else
    bwd_e<false>(qkv, out, out16, lse, dout, dqkv, dqkv16, acc, delta, dq_acc, (int)B, (int)T, (int)C, (int)H, cfg);
}

}  // namespace zerorun::kernels::flash
