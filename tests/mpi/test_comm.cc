// Communicator collectives on N MPI ranks (run under mpirun -np 2..4):
// f32 / bf16 / i32, uneven sizes, sync and async, against values each rank
// can compute locally.
#include <cmath>
#include <cstdio>
#include <vector>

#include "zerorun/comm.h"
#include "zerorun/error.h"

using namespace zerorun;

namespace {
int passed = 0, failed = 0;
void expect(bool ok, const char* what, int rank) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what);
  }
}
float val(int rank, int64_t i) { return static_cast<float>((rank + 1) * 0.5 + (i % 7) * 0.25); }
}  // namespace

int main() {
  auto comm = make_mpi_comm();
  const int R = comm->rank(), W = comm->size();
  for (int64_t n : {1, 3, 7, 1000, 4097}) {
    // all_reduce f32 sum and max
    std::vector<float> a(n);
    for (int64_t i = 0; i < n; ++i) a[i] = val(R, i);
    comm->all_reduce(a.data(), n, DType::F32, ReduceOp::Sum);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < W; ++r) s += val(r, i);
      ok = ok && std::fabs(a[i] - s) < 1e-5;
    }
    expect(ok, "all_reduce f32 sum", R);
    for (int64_t i = 0; i < n; ++i) a[i] = val(R, i);
    comm->all_reduce(a.data(), n, DType::F32, ReduceOp::Max);
    ok = true;
    for (int64_t i = 0; i < n; ++i) ok = ok && a[i] == val(W - 1, i);
    expect(ok, "all_reduce f32 max", R);
    // bf16 sum (values exactly representable, sums too)
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(val(R, i));
    comm->all_reduce(h.data(), n, DType::BF16, ReduceOp::Sum);
    ok = true;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < W; ++r) s += val(r, i);
      ok = ok && std::fabs(bf16_to_f32(h[i]) - s) <= 0.02 * s;
    }
    expect(ok, "all_reduce bf16 sum", R);
    // reduce_scatter: rank r gets the sum of chunk r
    std::vector<float> send(n * W), recv(n);
    for (int64_t i = 0; i < n * W; ++i) send[i] = val(R, i);
    comm->reduce_scatter(send.data(), recv.data(), n, DType::F32);
    ok = true;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < W; ++r) s += val(r, R * n + i);
      ok = ok && std::fabs(recv[i] - s) < 1e-5;
    }
    expect(ok, "reduce_scatter f32", R);
    // all_gather i32 + async f32
    std::vector<int32_t> mine(n, R * 1000), all(n * W);
    comm->all_gather(mine.data(), all.data(), n, DType::I32);
    ok = true;
    for (int r = 0; r < W; ++r)
      for (int64_t i = 0; i < n; ++i) ok = ok && all[r * n + i] == r * 1000;
    expect(ok, "all_gather i32", R);
    std::vector<float> fm(n, static_cast<float>(R)), fa(n * W);
    auto hnd = comm->all_gather_async(fm.data(), fa.data(), n, DType::F32);
    std::vector<float> b(n, 1.f);
    auto h2 = comm->all_reduce_async(b.data(), n, DType::F32, ReduceOp::Sum);
    hnd->wait();
    h2->wait();
    h2->wait();  // idempotent
    ok = true;
    for (int r = 0; r < W; ++r)
      ok = ok && fa[r * n] == static_cast<float>(r) && fa[r * n + n - 1] == static_cast<float>(r);
    for (int64_t i = 0; i < n; ++i) ok = ok && b[i] == static_cast<float>(W);
    expect(ok, "async all_gather + all_reduce", R);
    // broadcast from the last rank
    std::vector<float> c(n, static_cast<float>(R));
    comm->broadcast(c.data(), n, DType::F32, W - 1);
    expect(c[0] == static_cast<float>(W - 1) && c[n - 1] == static_cast<float>(W - 1), "broadcast", R);
  }
  comm->barrier();
  bool threw = false;
  try {
    comm->broadcast(nullptr, 1, DType::F32, W + 3);
  } catch (const Error&) {
    threw = true;
  }
  expect(threw, "bad root rejected", R);
  int f = failed;
  comm->all_reduce(&f, 1, DType::I32, ReduceOp::Sum);
  if (R == 0) std::printf("comm on %d ranks: %d passed, %d failed\n", W, passed * W, f);
  return f == 0 ? 0 : 1;
}
