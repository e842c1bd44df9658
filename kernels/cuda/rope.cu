// Rotary position embeddings on the GPU: a [T, D/2] cos/sin table per call
// (double-precision cos/sin of cpu::rope_angle over the op's frequencies,
// passed by value, so the CPU op's bits), then
// a block per token (at position row % T, or that of the positions input: packed documents, decoding steps) and a
// thread per feature pair of the output (forward) or of
// the input (backward: a key/value head sums its H / K copies in head order, no
// atomics); each side f32 or 16-bit storage (bf16/fp16 runs), computed in f32.
#include <algorithm>

#include "cuda_check.h"
#include "device_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "rope.h"

namespace zerorun::kernels::rope {
namespace {
constexpr int kTpb = 256;
unsigned blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + kTpb - 1) / kTpb, 65535 * 8)); }
// The kernels index within a row in 32 bits.
void check_row(int64_t T, int64_t H, int64_t K, int64_t D) {
  ZR_CHECK(T < (int64_t{1} << 31) && (3 * H + 2 * K) * D < (int64_t{1} << 31) && D / 2 <= cpu::RopeFreqs::kMaxPairs,
           "rope: a row of ", (3 * H + 2 * K) * D, " features or a length of ", T,
           " is beyond the CUDA kernels' 32-bit row indexing");
}
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20)); }

__global__ void k_table(float2* cs, int64_t T, int64_t D, const cpu::RopeFreqs f) {
  const int64_t half = D / 2;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < T * half; k += (int64_t)gridDim.x * blockDim.x) {
    double s, c;
    sincos(cpu::rope_angle(k / half, k % half, f), &s, &c);
    cs[k] = make_float2(static_cast<float>(c) * f.scale, static_cast<float>(s) * f.scale);
  }
}

__device__ inline float ld(In a, bool bf, int64_t i) { return a.f ? a.f[i] : from16(bf, a.h[i]); }
__device__ inline void st(Out a, bool bf, int64_t i, float v, bool acc) {
  if (a.f)
    a.f[i] = (acc ? a.f[i] : 0.f) + v;
  else
    a.h[i] = to16_bits(bf, v);
}

// A block per row (token) of the grid-stride loop over rows, its threads over the row's feature pairs: the pair's
// head and offset come from one 32-bit division (a thread per pair over the whole tensor took three 64-bit
// divisions a pair: 76 us a call at llama-336M's shape on an H100, ~6x its memory time).
// Output heads: H q, then Ko k, then Ko v (Ko = H where the key/value heads are repeated rep = H / K times, else K
// and rep = 1); output k/v head j reads input head j / rep.
// The table row of row r: its position pos[r] (clamped to the table's n rows), else r % T.
__device__ inline int64_t table_row(const int32_t* pos, int64_t r, int T, int64_t n) {
  if (!pos) return r % T;
  const int64_t p = pos[r];
  return p < 0 ? 0 : p >= n ? n - 1 : p;
}

__global__ void k_forward(In qkv, Out out, bool bf, const float2* cs, int64_t rows, int T, int H, int K, int D, int rep,
                          const int32_t* pos, int64_t n) {
  const int half = D / 2, Ko = K * rep, pairs = (H + 2 * Ko) * half;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t x = r * (H + 2 * K) * D, y = r * (H + 2 * Ko) * D;
    const float2* t = cs + table_row(pos, r, T, n) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const int j = p / half, i = p - j * half;
      const int64_t o = y + int64_t{j} * D + i;
      if (j >= H + Ko) {  // v: copied
        const int64_t src = x + int64_t{H + K + (j - H - Ko) / rep} * D + i;
        st(out, bf, o, ld(qkv, bf, src), false);
        st(out, bf, o + half, ld(qkv, bf, src + half), false);
        continue;
      }
      const int64_t src = x + int64_t{j < H ? j : H + (j - H) / rep} * D + i;
      const float2 c = t[i];
      const float a = ld(qkv, bf, src), b = ld(qkv, bf, src + half);
      st(out, bf, o, a * c.x - b * c.y, false);
      st(out, bf, o + half, b * c.x + a * c.y, false);
    }
  }
}

__global__ void k_backward(In dout, Out dqkv, bool acc, bool bf, const float2* cs, int64_t rows, int T, int H, int K,
                           int D, int rep, const int32_t* pos, int64_t n) {
  const int half = D / 2, Ko = K * rep, W = H + 2 * K, pairs = W * half;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t g = r * (H + 2 * Ko) * D;
    const float2* t = cs + table_row(pos, r, T, n) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const int j = p / half, i = p - j * half;
      const int64_t dst = r * W * D + int64_t{j} * D + i;
      float da = 0.f, db = 0.f;
      if (j >= H + K) {  // v head: the sum of its copies
        for (int c = (j - H - K) * rep; c < (j - H - K + 1) * rep; ++c) {
          da += ld(dout, bf, g + int64_t{H + Ko + c} * D + i);
          db += ld(dout, bf, g + int64_t{H + Ko + c} * D + i + half);
        }
      } else {
        const float2 e = t[i];
        const int first = j < H ? j : H + (j - H) * rep, cnt = j < H ? 1 : rep;
        for (int c = first; c < first + cnt; ++c) {
          const float ga = ld(dout, bf, g + int64_t{c} * D + i), gb = ld(dout, bf, g + int64_t{c} * D + i + half);
          da += ga * e.x + gb * e.y;
          db += gb * e.x - ga * e.y;
        }
      }
      st(dqkv, bf, dst, da, acc);
      st(dqkv, bf, dst + half, db, acc);
    }
  }
}

// The [T, D/2] cos/sin table in scratch, freed when the call's work is queued (stream-ordered).
DevBuf<float2> table(int64_t T, int64_t D, const cpu::RopeFreqs& f, cudaStream_t s) {
  DevBuf<float2> t(static_cast<size_t>(T * (D / 2)), false);
  k_table<<<blocks(T * (D / 2)), kTpb, 0, s>>>(t.p, T, D, f);
  ZR_CUDA(cudaGetLastError());
  return t;
}
}  // namespace

void forward(In qkv, Out out, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const cpu::RopeFreqs& f,
             bool repeat, const int32_t* pos, int64_t n_pos, cudaStream_t stream) {
  if (B * T == 0) return;
  check_row(T, H, K, D);
  const int64_t n = pos ? std::max<int64_t>(n_pos, 1) : T;
  const DevBuf<float2> t = table(n, D, f, stream);
  k_forward<<<row_blocks(B * T), kTpb, 0, stream>>>(qkv, out, bf, t.p, B * T, static_cast<int>(T), static_cast<int>(H),
                                                    static_cast<int>(K), static_cast<int>(D),
                                                    repeat ? static_cast<int>(H / K) : 1, pos, n);
  ZR_CUDA(cudaGetLastError());
}

void backward(In dout, Out dqkv, bool acc, bool bf, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
              const cpu::RopeFreqs& f, bool repeat, const int32_t* pos, int64_t n_pos, cudaStream_t stream) {
  if (B * T == 0) return;
  check_row(T, H, K, D);
  const int64_t n = pos ? std::max<int64_t>(n_pos, 1) : T;
  const DevBuf<float2> t = table(n, D, f, stream);
  k_backward<<<row_blocks(B * T), kTpb, 0, stream>>>(dout, dqkv, acc && dqkv.f, bf, t.p, B * T, static_cast<int>(T),
                                                     static_cast<int>(H), static_cast<int>(K), static_cast<int>(D),
                                                     repeat ? static_cast<int>(H / K) : 1, pos, n);
  ZR_CUDA(cudaGetLastError());
}
}  // namespace zerorun::kernels::rope
