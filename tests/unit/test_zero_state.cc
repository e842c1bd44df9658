// zero::ShardedState on its own, without a graph: 1, 2 and 3 ranks as threads over an in-process communicator, ZeRO
// stages 0-3, fp32 and bf16 compute. The weights each rank holds, the stage-3 gather/free life cycle and its
// prefetch, the gradient buckets' reduce-scatter, an update's refreshed and gathered compute copies, and checkpoint
// ranges saved at one world size and stage and loaded at another.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "zerorun/comm.h"
#include "zerorun/zero_state.h"

using namespace zerorun;
using namespace zerorun::zero;

namespace {

// ---- W ranks as threads: every collective stages its operands, meets the others at a barrier and reads theirs.
struct Hub {
  explicit Hub(int w) : world(w), send(static_cast<size_t>(w)), copy(static_cast<size_t>(w)) {}
  void barrier() {
    std::unique_lock<std::mutex> l(mu);
    const int64_t g = gen;
    if (++arrived == world) {
      arrived = 0;
      ++gen;
      cv.notify_all();
      return;
    }
    // A rank that failed never arrives: the others give up instead of hanging the test.
    if (!cv.wait_for(l, std::chrono::seconds(60), [&] { return gen != g; }))
      throw std::runtime_error("thread communicator: a rank did not reach the collective");
  }
  int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t gen = 0;
  std::vector<const void*> send;
  std::vector<std::vector<char>> copy;
};

class ThreadComm : public Communicator {
 public:
  ThreadComm(Hub& h, int rank) : h_(h), r_(rank) {}
  int rank() const override { return r_; }
  int size() const override { return h_.world; }
  std::string name() const override { return "threads"; }

 protected:
  void do_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    h_.copy[r_].assign(static_cast<char*>(buf), static_cast<char*>(buf) + bytes);
    h_.barrier();
    for (int64_t i = 0; i < count; ++i) {
      if (dt == DType::F32) {
        float a = reinterpret_cast<const float*>(h_.copy[0].data())[i];
        for (int q = 1; q < h_.world; ++q) {
          const float b = reinterpret_cast<const float*>(h_.copy[q].data())[i];
          a = op == ReduceOp::Sum ? a + b : std::max(a, b);
        }
        static_cast<float*>(buf)[i] = a;
      } else {
        if (dt != DType::I32) throw std::runtime_error("all_reduce of f32 or i32 only");
        int32_t a = reinterpret_cast<const int32_t*>(h_.copy[0].data())[i];
        for (int q = 1; q < h_.world; ++q) {
          const int32_t b = reinterpret_cast<const int32_t*>(h_.copy[q].data())[i];
          a = op == ReduceOp::Sum ? a + b : std::max(a, b);
        }
        static_cast<int32_t*>(buf)[i] = a;
      }
    }
    h_.barrier();
  }
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt) override {
    if (dt != DType::F32) throw std::runtime_error("reduce_scatter of f32 only");
    h_.send[r_] = send;
    h_.barrier();
    for (int64_t i = 0; i < count; ++i) {
      float a = 0.f;
      for (int q = 0; q < h_.world; ++q) a += static_cast<const float*>(h_.send[q])[r_ * count + i];
      static_cast<float*>(recv)[i] = a;
    }
    h_.barrier();
  }
  void do_all_gather(const void* send, void* recv, int64_t count, DType dt) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    h_.send[r_] = send;
    h_.barrier();
    for (int q = 0; q < h_.world; ++q) std::memcpy(static_cast<char*>(recv) + q * bytes, h_.send[q], bytes);
    h_.barrier();
  }
  void do_broadcast(void* buf, int64_t count, DType dt, int root) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    h_.send[r_] = buf;
    h_.barrier();
    if (r_ != root) std::memcpy(buf, h_.send[root], bytes);
    h_.barrier();
  }
  void do_barrier() override { h_.barrier(); }

 private:
  Hub& h_;
  int r_;
};

// fn(comm, fail) on W threads; returns every rank's failures ("" each when all passed). Catch2's assertions are
// not thread-safe: the ranks record what failed and the test asserts on the main thread.
using Fail = std::function<void(const std::string&)>;
std::string on_ranks(int W, const std::function<void(Communicator&, const Fail&)>& fn) {
  Hub hub(W);
  std::vector<std::string> errs(static_cast<size_t>(W));
  std::vector<std::thread> ts;
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      ThreadComm c(hub, r);
      auto fail = [&, r](const std::string& what) {
        if (errs[r].size() < 2000) errs[r] += "rank " + std::to_string(r) + ": " + what + "\n";
      };
      try {
        fn(c, fail);
      } catch (const std::exception& e) {
        fail(std::string("threw: ") + e.what());
      }
    });
  for (auto& t : ts) t.join();
  std::string all;
  for (auto& e : errs) all += e;
  return all;
}

// ---- a model without a graph: four blocks, odd sizes, a tied weight used by two blocks
struct Toy {
  std::vector<ParamUse> uses = {{0, "emb", 37}, {1, "w1", 35}, {1, "b1", 3},
                                {2, "w2", 11},  {2, "w1", 35}, {3, "head", 26}};
  std::map<std::string, Shape> shapes = {{"emb", {37}}, {"w1", {5, 7}}, {"b1", {3}}, {"w2", {11}}, {"head", {13, 2}}};
  int blocks = 4;
  static float value(const std::string& name, int64_t i) {
    return static_cast<float>(name.size()) * 0.37f + static_cast<float>(name[0]) * 0.011f +
           static_cast<float>(i) * 0.0173f;
  }
  WeightReader reader() const {
    return [](const std::string& name, int64_t first, int64_t count, float* dst) {
      for (int64_t i = 0; i < count; ++i) dst[i] = value(name, first + i);
    };
  }
  int uses_of(const std::string& name, int block) const {
    int n = 0;
    for (auto& u : uses) n += u.name == name && u.block == block;
    return n;
  }
};

StateOptions options(int stage, DType dt = DType::F32) {
  StateOptions o;
  o.stage = stage;
  o.compute_dtype = dt;
  // Stages 2-3: emb, w1 and head a bucket each, b1 one of its own after w1 (3 elements: persistent at stage 3 with
  // a threshold above 3), w2 alone in its block.
  o.bucket = 36;
  return o;
}

std::string str(const std::string& what, int64_t a, int64_t b) {
  std::ostringstream os;
  os << what << " (" << a << " vs " << b << ")";
  return os.str();
}

// Bound tensors by name, as an executor would hold them.
struct Bound {
  std::map<std::string, Tensor> params, grads;
  Binding binding() {
    return {[this](const std::string& n, const Tensor& t) { params[n] = t; },
            [this](const std::string& n, const Tensor& t) { grads[n] = t; }};
  }
};

bool equals(const Tensor& t, const std::function<float(int64_t)>& want) {
  if (!t.defined()) return false;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.f32()[i] != want(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("ShardedState: each rank's weights, master and checkpoint ranges, stages 0-3 on 1-3 ranks", "[zero]") {
  const Toy toy;
  for (int W = 1; W <= 3; ++W)
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(W, stage);
      std::string errs = on_ranks(W, [&](Communicator& comm, const Fail& fail) {
        ShardedState st(toy.uses, toy.blocks, toy.shapes, options(stage), comm, toy.reader());
        const Plan& plan = st.plan();
        if (plan.world != W || plan.params.size() != 5) fail("plan");
        Bound b;
        auto views = st.param_views();
        st.bind(b.binding());
        for (auto& s : plan.params) {
          auto want = [&](int64_t i) { return Toy::value(s.name, i); };
          if (stage < 3 && !equals(views.at(s.name), want)) fail("compute view of " + s.name);
          if (stage == 3 && views.at(s.name).defined()) fail("stage 3 binds " + s.name + " only when gathered");
          if ((stage < 2) != st.grad_views().at(s.name).defined()) fail("grad view of " + s.name);
        }
        // Stage 3: a gathered group's parameters are bound with every rank's pieces, unbound when released.
        if (stage == 3)
          for (size_t g = 0; g < plan.groups.size(); ++g) {
            st.ensure_live(static_cast<int>(g));
            for (int p : plan.groups[g].params) {
              const std::string& n = plan.params[static_cast<size_t>(p)].name;
              if (!equals(b.params[n], [&](int64_t i) { return Toy::value(n, i); })) fail("gathered " + n);
            }
            st.release(static_cast<int>(g));
            for (int p : plan.groups[g].params)
              if (b.params[plan.params[static_cast<size_t>(p)].name].defined()) fail("released group still bound");
          }
        // Checkpoint ranges: the ranks' ranges tile each parameter; the master holds the weights over own_range;
        // optimizer state indices are distinct and inside the optimizer's range.
        std::set<int64_t> seen;
        const int64_t state_n = stage == 0 ? plan.padded : plan.shard_numel();
        for (size_t p = 0; p < plan.params.size(); ++p) {
          const ParamSlot& s = plan.params[p];
          const int pi = static_cast<int>(p);
          int64_t at = 0;
          for (int q = 0; q < W; ++q) {
            Range rg = st.ckpt_range(pi, q);
            if (rg.empty()) continue;
            if (rg.begin != at) fail(str("ckpt ranges of " + s.name + " leave a gap", rg.begin, at));
            at = rg.end;
          }
          if (at != s.numel) fail(str("ckpt ranges of " + s.name + " end early", at, s.numel));
          Range own = st.own_range(pi);
          if (stage > 0 &&
              (own.begin != st.ckpt_range(pi, comm.rank()).begin || own.end != st.ckpt_range(pi, comm.rank()).end))
            fail("own range of " + s.name + " is not the range this rank saves");
          std::vector<float> mine(static_cast<size_t>(own.size()));
          if (!own.empty()) st.read_master(pi, own, mine.data());
          for (int64_t e = own.begin; e < own.end; ++e) {
            if (mine[static_cast<size_t>(e - own.begin)] != Toy::value(s.name, e)) fail("master of " + s.name);
            const int64_t k = st.state_offset(pi, e);
            if (k < 0 || k >= state_n || !seen.insert(k).second) fail(str("state offset of " + s.name, k, state_n));
          }
        }
        // The full master on every rank (a collective from stage 1 on).
        auto full = st.full_master_weights();
        for (auto& s : plan.params)
          if (!equals(full.at(s.name), [&](int64_t i) { return Toy::value(s.name, i); }))
            fail("full master of " + s.name);
        // Model-state bytes: stage 3 keeps a shard of the weights, stages 2-3 a shard of the gradients.
        if (st.param_bytes() != 4 * (stage < 3 ? plan.padded : plan.shard_numel())) fail("param bytes");
        if (st.grad_bytes() != 4 * (stage < 2 ? plan.padded : plan.shard_numel())) fail("grad bytes");
        // The optimizer's moments: over the update's range, where the optimizer runs; read and written in f32.
        MomentStore& ms = st.make_moments(2, stage == 1 ? DType::BF16 : DType::F32);
        if (ms.size() != state_n || ms.ram_bytes() != 2 * state_n * (stage == 1 ? 2 : 4)) fail("moments' size");
        const float x[3] = {1.5f, -0.25f, 3.0f};
        float y[3] = {};
        ms.write(1, state_n - 3, 3, x);
        ms.read(1, state_n - 3, 3, y);
        if (y[0] != x[0] || y[1] != x[1] || y[2] != x[2]) fail("moments' round trip");
        for (const BufferInfo& bi : st.buffers())
          if (bi.placement != Placement::Host)
            fail("CPU buffer " + bi.name + " placed on " + placement_name(bi.placement));
      });
      REQUIRE(errs == "");
    }
}

TEST_CASE("ShardedState: stage-3 gather/free with prefetch and the gradient buckets' reduce, 1-3 ranks", "[zero]") {
  const Toy toy;
  for (int W = 1; W <= 3; ++W)
    for (int stage = 0; stage <= 3; ++stage)
      for (int64_t prefetch : {int64_t{0}, int64_t{1} << 20}) {
        CAPTURE(W, stage, prefetch);
        std::string errs = on_ranks(W, [&](Communicator& comm, const Fail& fail) {
          StateOptions o = options(stage);
          o.prefetch_bucket = prefetch;
          o.persistence_threshold = 4;  // b1's group stays gathered at stage 3
          ShardedState st(toy.uses, toy.blocks, toy.shapes, o, comm, toy.reader());
          const Plan& plan = st.plan();
          Bound b;
          st.bind(b.binding());
          for (auto& [n, t] : st.grad_views()) b.grads[n] = t;  // stages 0-1: bound for good
          const auto& bg = st.block_groups();
          auto check_block_live = [&](int blk) {
            for (int g : bg[static_cast<size_t>(blk)])
              for (int p : plan.groups[static_cast<size_t>(g)].params) {
                const std::string& n = plan.params[static_cast<size_t>(p)].name;
                if (!equals(b.params[n], [&](int64_t i) { return Toy::value(n, i); }))
                  fail("block " + std::to_string(blk) + ": " + n + " not live");
              }
          };
          // Two micro-batches: forward, then backward adding (rank + 1) for every use of a parameter.
          for (int micro = 0; micro < 2; ++micro) {
            for (int blk = 0; blk < toy.blocks; ++blk) {
              st.on_block(static_cast<size_t>(blk), true, true);
              if (stage == 3) {
                check_block_live(blk);
                // Prefetch: the next block's groups are on their way exactly when there is a budget.
                if (blk + 1 < toy.blocks)
                  for (int g : bg[static_cast<size_t>(blk + 1)]) {
                    const auto& mine = bg[static_cast<size_t>(blk)];
                    if (std::find(mine.begin(), mine.end(), g) != mine.end() || st.persistent(g)) continue;
                    if (st.gathered(g) != (prefetch > 0)) fail("prefetch of group " + std::to_string(g));
                  }
              }
              st.on_block(static_cast<size_t>(blk), true, false);
            }
            for (int blk = toy.blocks - 1; blk >= 0; --blk) {
              st.on_block(static_cast<size_t>(blk), false, true);
              if (stage == 3) check_block_live(blk);
              for (auto& s : plan.params) {
                const int n = toy.uses_of(s.name, blk);
                if (n == 0) continue;
                const Tensor& gt = b.grads[s.name];
                if (!gt.defined()) {
                  fail("no gradient bound for " + s.name + " in block " + std::to_string(blk));
                  continue;
                }
                for (int64_t i = 0; i < gt.numel(); ++i) gt.f32()[i] += static_cast<float>(n * (comm.rank() + 1));
              }
              st.on_block(static_cast<size_t>(blk), false, false);
            }
            if (stage == 3)  // every group freed after the backward but the persistent ones
              for (size_t g = 0; g < plan.groups.size(); ++g)
                if (st.gathered(static_cast<int>(g)) != st.persistent(static_cast<int>(g)))
                  fail("group " + std::to_string(g) + " gathered after the backward");
            if (stage >= 2)
              for (auto& [n, t] : b.grads)
                if (t.defined()) fail("bucket of " + n + " still bound after its reduce");
          }
          // Stages 0-1 keep this rank's full gradients (the step all-reduces them); stages 2-3 this rank's shard of
          // the sum over ranks, two micro-batches accumulated.
          const Tensor& gbuf = st.grads();
          const float sum_r = static_cast<float>(W * (W + 1) / 2);
          std::vector<float> want(static_cast<size_t>(gbuf.numel()), 0.f);
          for (size_t p = 0; p < plan.params.size(); ++p) {
            const ParamSlot& s = plan.params[p];
            int uses = 0;
            for (int blk = 0; blk < toy.blocks; ++blk) uses += toy.uses_of(s.name, blk);
            const float v = 2.f * static_cast<float>(uses) * (stage < 2 ? static_cast<float>(comm.rank() + 1) : sum_r);
            if (stage < 2) {
              for (int64_t i = 0; i < s.numel; ++i) want[static_cast<size_t>(s.offset + i)] = v;
            } else {
              const Range own = plan.param_owned(static_cast<int>(p), comm.rank());
              const Range grp = plan.owned(s.group, comm.rank());
              for (int64_t e = own.begin; e < own.end; ++e)
                want[static_cast<size_t>(st.shard_offset(s.group) + s.offset + e - grp.begin)] = v;
            }
          }
          for (int64_t i = 0; i < gbuf.numel(); ++i)
            if (gbuf.f32()[i] != want[static_cast<size_t>(i)]) {
              fail(str("gradient element", i, gbuf.numel()) + ": " + std::to_string(gbuf.f32()[i]) + " want " +
                   std::to_string(want[static_cast<size_t>(i)]));
              break;
            }
        });
        REQUIRE(errs == "");
      }
}

TEST_CASE(
    "ShardedState: an update refreshes and gathers the bf16 compute copies; checkpoint ranges move between "
    "world sizes and stages",
    "[zero]") {
  const Toy toy;
  auto updated = [](const std::string& n, int64_t i) { return Toy::value(n, i) + 0.3f; };
  // Master values by parameter as a checkpoint holds them (each rank's ckpt_range written into one map).
  std::map<std::string, std::vector<float>> saved;
  std::mutex saved_mu;
  for (int W = 1; W <= 3; ++W)
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(W, stage);
      std::string errs = on_ranks(W, [&](Communicator& comm, const Fail& fail) {
        ShardedState st(toy.uses, toy.blocks, toy.shapes, options(stage, DType::BF16), comm, toy.reader());
        const Plan& plan = st.plan();
        Bound b;
        st.bind(b.binding());
        if (!st.master().defined()) fail("bf16 compute keeps an fp32 master");
        const bool targets = st.update_targets(0).f32 != nullptr;
        if (targets != (stage < 3)) fail("fused-update targets");
        // The compute copies start rounded from the weights.
        for (auto& [n, t] : st.param_views())
          if (stage < 3 && !equals(t, [&](int64_t i) { return round_to(DType::BF16, Toy::value(n, i)); }))
            fail("rounded compute copy of " + n);
        // An update of the master (what the optimizer does), then the copies refreshed and gathered.
        if (stage == 0) {
          for (auto& s : plan.params)
            for (int64_t i = 0; i < s.numel; ++i) st.full_master()[s.offset + i] = updated(s.name, i);
        } else {
          for (size_t g = 0; g < plan.groups.size(); ++g) {
            const UpdatePiece u = st.update_piece(static_cast<int>(g));
            for (int64_t i = 0; i < u.n; ++i) {
              const int64_t flat = u.flat_begin + i;  // this rank's element of the flat layout
              for (int p : plan.groups[g].params) {
                const ParamSlot& s = plan.params[static_cast<size_t>(p)];
                if (flat >= s.offset && flat < s.offset + s.numel) u.weights[i] = updated(s.name, flat - s.offset);
              }
            }
          }
        }
        st.after_update(false);
        for (auto& s : plan.params) {
          auto want = [&](int64_t i) { return round_to(DType::BF16, updated(s.name, i)); };
          if (stage < 3 && !equals(Tensor::view_of(st.compute(), s.offset, {s.numel}), want))
            fail("compute copy of " + s.name + " after the update");
        }
        if (stage == 3)
          for (size_t g = 0; g < plan.groups.size(); ++g) {
            st.ensure_live(static_cast<int>(g));
            for (int p : plan.groups[g].params) {
              const std::string& n = plan.params[static_cast<size_t>(p)].name;
              if (!equals(b.params[n], [&](int64_t i) { return round_to(DType::BF16, updated(n, i)); }))
                fail("gathered compute copy of " + n + " after the update");
            }
            st.release(static_cast<int>(g));
          }
        // Save: this rank's ranges of the master.
        for (size_t p = 0; p < plan.params.size(); ++p) {
          const Range rg = st.ckpt_range(static_cast<int>(p), comm.rank());
          std::lock_guard<std::mutex> l(saved_mu);
          auto& v = saved[plan.params[p].name];
          v.resize(static_cast<size_t>(plan.params[p].numel));
          if (!rg.empty()) st.read_master(static_cast<int>(p), rg, v.data() + rg.begin);
        }
      });
      REQUIRE(errs == "");
      // Load what was saved at (W, stage) on (4 - W) ranks at stage (stage + 1) % 4: each rank reads its load_range.
      const int W2 = 4 - W, stage2 = (stage + 1) % 4;
      CAPTURE(W2, stage2);
      errs = on_ranks(W2, [&](Communicator& comm, const Fail& fail) {
        ShardedState st(toy.uses, toy.blocks, toy.shapes, options(stage2, DType::BF16), comm, toy.reader());
        const Plan& plan = st.plan();
        Bound b;
        st.bind(b.binding());
        for (size_t p = 0; p < plan.params.size(); ++p) {
          const Range need = st.load_range(static_cast<int>(p));
          if (need.empty()) continue;
          const auto& v = saved.at(plan.params[p].name);
          st.load_master(static_cast<int>(p), need, std::vector<float>(v.begin() + need.begin, v.begin() + need.end));
        }
        st.after_load();
        auto full = st.full_master_weights();
        for (auto& s : plan.params) {
          if (!equals(full.at(s.name), [&](int64_t i) { return updated(s.name, i); })) fail("loaded master " + s.name);
          auto want = [&](int64_t i) { return round_to(DType::BF16, updated(s.name, i)); };
          if (stage2 < 3 && !equals(Tensor::view_of(st.compute(), s.offset, {s.numel}), want))
            fail("loaded compute copy of " + s.name);
          if (stage2 == 3) {
            st.ensure_live(s.group);
            if (!equals(b.params[s.name], want)) fail("loaded and gathered compute copy of " + s.name);
            st.release(s.group);
          }
        }
      });
      REQUIRE(errs == "");
    }
}

TEST_CASE("ShardedState: bad options are rejected", "[zero]") {
  const Toy toy;
  auto comm = make_self_comm();
  StateOptions o = options(4);
  REQUIRE_THROWS_WITH(ShardedState(toy.uses, toy.blocks, toy.shapes, o, *comm, toy.reader()),
                      Catch::Contains("ZeRO stage must be 0..3"));
  o = options(2);
  o.offload_optimizer = true;  // CPU ranks keep everything in host memory already
  REQUIRE_THROWS_WITH(ShardedState(toy.uses, toy.blocks, toy.shapes, o, *comm, toy.reader()),
                      Catch::Contains("offload_optimizer"));
  std::map<std::string, Shape> missing = toy.shapes;
  missing.erase("w2");
  REQUIRE_THROWS_WITH(ShardedState(toy.uses, toy.blocks, missing, options(1), *comm, toy.reader()),
                      Catch::Contains("no shape for parameter 'w2'"));
}

TEST_CASE("ShardedState: the stage-3 parameter shard on NVMe reads, updates, gathers and saves as in memory",
          "[zero][nvme][posix]") {
  const Toy toy;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zr_param_nvme_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  auto updated = [](const std::string& n, int64_t i) { return Toy::value(n, i) * 0.5f - 1.0f; };
  for (int W = 1; W <= 3; ++W)
    for (int64_t max_in_cpu : {int64_t{0}, int64_t{12}, int64_t{40}}) {  // all on NVMe; the first groups in memory
      CAPTURE(W, max_in_cpu);
      std::string errs = on_ranks(W, [&](Communicator& comm, const Fail& fail) {
        StateOptions o = options(3);
        o.persistence_threshold = 4;  // b1's group stays gathered: after_update gathers it from the file
        o.param_nvme_path = dir.string();
        o.param_max_in_cpu = max_in_cpu;
        o.param_nvme_chunk = 8;  // chunks that split groups
        o.param_nvme_buffers = 2;
        ShardedState st(toy.uses, toy.blocks, toy.shapes, o, comm, toy.reader());
        const Plan& plan = st.plan();
        // Groups stay in memory while the shard's elements up to their end fit max_in_cpu.
        int64_t in_ram = 0;
        for (const Group& g : plan.groups) {
          if (in_ram + g.shard > max_in_cpu) break;
          in_ram += g.shard;
        }
        if (in_ram == plan.shard_numel()) {  // everything fits: no file
          if (st.param_nvme()) fail("a parameter file though the shard fits max_in_cpu");
          return;
        }
        if (!st.param_nvme()) fail("no parameter file");
        if (st.param_nvme_bytes() != (plan.shard_numel() - in_ram) * 4) fail("NVMe bytes");
        bool listed = false;
        for (const BufferInfo& b : st.buffers())
          listed = listed || (b.name == "param_shard" && b.placement == Placement::Nvme);
        if (!listed) fail("buffers() lists no parameter shard on NVMe");
        Bound b;
        st.bind(b.binding());
        auto check = [&](const std::function<float(const std::string&, int64_t)>& want, const std::string& when) {
          for (size_t p = 0; p < plan.params.size(); ++p) {
            const Range own = st.own_range(static_cast<int>(p));
            std::vector<float> mine(static_cast<size_t>(own.size()));
            if (!own.empty()) st.read_master(static_cast<int>(p), own, mine.data());
            for (int64_t e = own.begin; e < own.end; ++e)
              if (mine[static_cast<size_t>(e - own.begin)] != want(plan.params[p].name, e))
                fail(when + ": master of " + plan.params[p].name);
          }
          for (size_t g = 0; g < plan.groups.size(); ++g) {
            st.ensure_live(static_cast<int>(g));
            for (int p : plan.groups[g].params) {
              const std::string& n = plan.params[static_cast<size_t>(p)].name;
              if (!equals(b.params[n], [&](int64_t i) { return want(n, i); })) fail(when + ": gathered " + n);
            }
            st.release(static_cast<int>(g));
          }
        };
        check([](const std::string& n, int64_t i) { return Toy::value(n, i); }, "loaded");
        // The optimizer's pass: each piece updated in place, then handed back (written to the file).
        for (size_t g = 0; g < plan.groups.size(); ++g) {
          const UpdatePiece u = st.update_piece(static_cast<int>(g));
          for (int64_t i = 0; i < u.n; ++i)
            for (int p : plan.groups[g].params) {
              const ParamSlot& s = plan.params[static_cast<size_t>(p)];
              const int64_t flat = u.flat_begin + i;
              if (flat >= s.offset && flat < s.offset + s.numel) u.weights[i] = updated(s.name, flat - s.offset);
            }
          st.end_update_piece(static_cast<int>(g));
        }
        st.after_update(false);
        check(updated, "updated");
        // A checkpoint's load writes through to the file as well.
        for (size_t p = 0; p < plan.params.size(); ++p) {
          const Range need = st.load_range(static_cast<int>(p));
          std::vector<float> v(static_cast<size_t>(need.size()));
          for (int64_t e = need.begin; e < need.end; ++e)
            v[static_cast<size_t>(e - need.begin)] = Toy::value(plan.params[p].name, e) + 2;
          st.load_master(static_cast<int>(p), need, v);
        }
        st.after_load();
        check([](const std::string& n, int64_t i) { return Toy::value(n, i) + 2; }, "loaded from a checkpoint");
      });
      REQUIRE(errs == "");
    }
  CHECK(fs::is_empty(dir));  // every rank's file and directory removed
  fs::remove_all(dir);
}
