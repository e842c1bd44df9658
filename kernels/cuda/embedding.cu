// Embeddings on the GPU: token and position lookups, the deterministic sorted gradient, and the id range checks
// (immediate and deferred). Part of the CUDA backend (backend_cuda.h).
#include "backend_cuda.h"

namespace zerorun::kernels {
namespace {

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

}  // namespace

bool CudaBackend::ids_in_range(const int32_t* ids, int64_t n, int64_t V) {
  DevBuf<int> bad(1);
  LAUNCH(k_ids_check, n, ids, n, V, bad.p, 1);
  int h = 0;
  cuda::fetch(&h, bad.p, sizeof h);
  return h == 0;
}

// Queued without a wait: the first failing check since the last read raises its message at the next
// get_scalar. A message's code stays the same for the run, so a CUDA graph replaying the check stays right.
void CudaBackend::check_ids_deferred(const int32_t* ids, int64_t n, int64_t V, const std::string& message,
                                     int32_t ignore) {
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

void CudaBackend::embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t V) {
  LAUNCH(k_emb_fwd, N * C, ids, table, out, N, C, V);
}

void CudaBackend::embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t V) {
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
  ZR_CUDA(cub::DeviceRadixSort::SortPairs(scratch.p, temp, keys.p, keys.p + N, pos.p, pos.p + N, static_cast<int>(N), 0,
                                          bits, cuda::stream()));
  const int64_t chunks = (N + kEmbChunk - 1) / kEmbChunk;
  DevBuf<float> part(static_cast<size_t>(2 * chunks * C), false);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(chunks, 65535));
  const unsigned threads = static_cast<unsigned>(std::clamp<int64_t>((C % 4 == 0 ? C / 4 : C + 31) / 32 * 32, 32, 256));
  if (C % 4 == 0 && aligned16(dout) && aligned16(dtable)) {
    k_emb_bwd_chunks<4><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, pos.p + N, dout, dtable, part.p, N, C, V);
    k_emb_bwd_spans<4><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, part.p, dtable, N, C, V);
  } else {
    k_emb_bwd_chunks<1><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, pos.p + N, dout, dtable, part.p, N, C, V);
    k_emb_bwd_spans<1><<<grid, threads, 0, cuda::stream()>>>(keys.p + N, part.p, dtable, N, C, V);
  }
  ZR_CUDA(cudaGetLastError());
}

void CudaBackend::pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) {
  LAUNCH(k_pos_fwd, B * T * C, table, out, B, T, C);
}

void CudaBackend::pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) {
  LAUNCH(k_pos_bwd, T * C, dout, dtable, B, T, C);
}

// Throws the message of the first failed deferred id check since the last call (flag already copied back,
// unless `fetch`) and clears the flag.
void CudaBackend::raise_deferred(bool fetch) {
  if (!ids_flag_) return;
  ids_unread_ = 0;
  if (fetch) cuda::fetch(ids_flag_host_, ids_flag_, sizeof(int));
  const int f = *ids_flag_host_;
  if (!f) return;
  *ids_flag_host_ = 0;
  ZR_CUDA(cudaMemsetAsync(ids_flag_, 0, sizeof(int), cuda::stream()));
  ZR_FAIL(ids_messages_.at(static_cast<size_t>(f - 1)));
}

}  // namespace zerorun::kernels
