// MPI communicator over host buffers. 16-bit floats travel as MPI_UINT16_T
// with user-defined reduction ops that add in f32 (MPI has no bf16/f16).
#include <mpi.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "zerorun/comm.h"
#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/rank_status.h"

namespace zerorun {
namespace {

std::atomic<int> g_local_rank{-1};

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  ZR_FAIL("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool Max>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(Max ? (x > y ? x : y) : x + y);
  }
}

struct Ops {
  MPI_Op bf16_sum, bf16_max, f16_sum, f16_max;
};
Ops& ops() {
  static Ops o = [] {
    Ops r{};
    MPI_Op_create(&half_op<bf16_to_f32, f32_to_bf16, false>, 1, &r.bf16_sum);
    MPI_Op_create(&half_op<bf16_to_f32, f32_to_bf16, true>, 1, &r.bf16_max);
    MPI_Op_create(&half_op<f16_to_f32, f32_to_f16, false>, 1, &r.f16_sum);
    MPI_Op_create(&half_op<f16_to_f32, f32_to_f16, true>, 1, &r.f16_max);
    return r;
  }();
  return o;
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    default:
      return MPI_UINT16_T;
  }
}

MPI_Op mpi_op(DType dt, ReduceOp op) {
  bool mx = op == ReduceOp::Max;
  switch (dt) {
    case DType::BF16:
      return mx ? ops().bf16_max : ops().bf16_sum;
    case DType::F16:
      return mx ? ops().f16_max : ops().f16_sum;
    case DType::U16:
      ZR_FAIL("reductions over u16 are not supported");
    default:
      return mx ? MPI_MAX : MPI_SUM;
  }
}

int to_int(int64_t n, const char* what) {
  ZR_CHECK(n <= 0x7fffffff, what, ": ", n, " elements exceed MPI's int count; split the buffer");
  return static_cast<int>(n);
}

class MpiHandle : public CommHandle {
 public:
  MPI_Request req = MPI_REQUEST_NULL;
  ~MpiHandle() override {
    if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (req != MPI_REQUEST_NULL) mpi_check(MPI_Wait(&req, MPI_STATUS_IGNORE), "wait");
  }
};

class MpiComm : public Communicator {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node = MPI_COMM_NULL;  // the ranks sharing this node's memory
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
        node != MPI_COMM_NULL) {
      int local = 0;
      if (MPI_Comm_rank(node, &local) == MPI_SUCCESS) g_local_rank.store(local);
      MPI_Comm_free(&node);
    }
    double timeout = 600;  // 10 minutes, like PyTorch's default collective timeout for NCCL
    if (const char* t = knobs().has_comm_timeout ? knobs().comm_timeout.c_str() : nullptr) {
      char* end = nullptr;
      timeout = std::strtod(t, &end);
      ZR_CHECK(end != t && *end == '\0' && timeout >= 0 && timeout < 1e9, "ZERORUN_COMM_TIMEOUT '", t,
               "' is not a number of seconds (0 turns the watchdog off)");
    }
    rank_status::set_identity(rank_, size_);  // what this rank tells the launcher when it fails
    if (size_ > 1) enable_watchdog(timeout, [] { MPI_Abort(MPI_COMM_WORLD, 1); });
  }
  ~MpiComm() override { enable_watchdog(0, nullptr); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType dt, ReduceOp op) override {
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n, "all_reduce"), mpi_type(dt), mpi_op(dt, op), MPI_COMM_WORLD),
              "all_reduce");
  }
  void do_reduce_scatter(const void* s, void* r, int64_t n, DType dt) override {
    mpi_check(MPI_Reduce_scatter_block(s, r, to_int(n, "reduce_scatter"), mpi_type(dt), mpi_op(dt, ReduceOp::Sum),
                                       MPI_COMM_WORLD),
              "reduce_scatter");
  }
  void do_all_gather(const void* s, void* r, int64_t n, DType dt) override {
    int c = to_int(n, "all_gather");
    mpi_check(MPI_Allgather(s, c, mpi_type(dt), r, c, mpi_type(dt), MPI_COMM_WORLD), "all_gather");
  }
  void do_broadcast(void* buf, int64_t n, DType dt, int root) override {
    mpi_check(MPI_Bcast(buf, to_int(n, "broadcast"), mpi_type(dt), root, MPI_COMM_WORLD), "broadcast");
  }
  void do_barrier() override { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }
  std::unique_ptr<CommHandle> do_all_reduce_async(void* buf, int64_t n, DType dt, ReduceOp op) override {
    auto h = std::make_unique<MpiHandle>();
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n, "all_reduce"), mpi_type(dt), mpi_op(dt, op), MPI_COMM_WORLD,
                             &h->req),
              "all_reduce_async");
    return h;
  }
  std::unique_ptr<CommHandle> do_all_gather_async(const void* s, void* r, int64_t n, DType dt) override {
    auto h = std::make_unique<MpiHandle>();
    int c = to_int(n, "all_gather");
    mpi_check(MPI_Iallgather(s, c, mpi_type(dt), r, c, mpi_type(dt), MPI_COMM_WORLD, &h->req), "all_gather_async");
    return h;
  }
  std::unique_ptr<CommHandle> do_reduce_scatter_async(const void* s, void* r, int64_t n, DType dt) override {
    auto h = std::make_unique<MpiHandle>();
    mpi_check(MPI_Ireduce_scatter_block(s, r, to_int(n, "reduce_scatter"), mpi_type(dt), mpi_op(dt, ReduceOp::Sum),
                                        MPI_COMM_WORLD, &h->req),
              "reduce_scatter_async");
    return h;
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_comm() { return std::make_unique<MpiComm>(); }

void mpi_abort_job(int code) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

int mpi_local_rank() { return g_local_rank.load(); }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* s = std::getenv(v);
    if (s && std::atoi(s) > 1) return true;
  }
  return false;
}

}  // namespace zerorun
