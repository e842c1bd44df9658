// Engine on N MPI ranks (mpirun -np 2..4): model-state memory per stage
// (stage 3 ~ 1/N of stage 0), overflow on one rank skips the step on all,
// stage 3 + activation checkpointing equals plain stage 3.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tests/common/tiny.h"
#include "zerorun/engine.h"
#include "zerorun/zero_plan.h"

using namespace zerorun;

namespace {
int passed = 0, failed = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what.c_str());
  }
}
Model tiny() { return testing::tiny_gpt(21, 96, 48); }
Config cfg(const std::string& text, int world) { return testing::make_cfg(text, world, 48); }
}  // namespace

int main() {
  auto comm = make_mpi_comm();
  const int R = comm->rank(), W = comm->size();
  Model m = tiny();
  auto data = make_data_source("synthetic", m, 16, 3);

  // 1. Model-state bytes per stage.
  ModelStateBytes b[4];
  double loss[4];
  for (int st = 0; st <= 3; ++st) {
    Config c = cfg(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": )" + std::to_string(st) +
                       R"(, "stage3_param_persistence_threshold": 0}})",
                   W);
    Engine e(m, c, *comm, 2);
    loss[st] = e.train_step(*data).loss;
    b[st] = e.model_state_bytes();
    if (R == 0)
      std::printf("stage %d on %d ranks: params %lld grads %lld optimizer %lld bytes per rank\n", st, W,
                  static_cast<long long>(b[st].params), static_cast<long long>(b[st].grads),
                  static_cast<long long>(b[st].optimizer));
  }
  const double P = static_cast<double>(m.num_params());
  auto near = [&](double got, double want) { return got >= want && got <= want * 1.01 + 4096; };
  expect(near(b[0].params, 4 * P) && near(b[0].grads, 4 * P) && near(b[0].optimizer, 8 * P), "stage 0 bytes", R);
  expect(near(b[1].params, 4 * P) && near(b[1].grads, 4 * P) && near(b[1].optimizer, 8 * P / W), "stage 1 bytes", R);
  expect(near(b[2].params, 4 * P) && near(b[2].grads, 4 * P / W) && near(b[2].optimizer, 8 * P / W), "stage 2 bytes",
         R);
  expect(near(b[3].total(), 16 * P / W), "stage 3 total ~ 1/N of stage 0", R);
  for (int st = 0; st <= 3; ++st) {  // what `zerorun estimate` prints for this run
    const zero::StateEstimate e = zero::estimate_model_states(P, st, W, false, false, false, false);
    expect(near(b[st].params, e.params) && near(b[st].grads, e.grads) && near(b[st].optimizer, e.optimizer),
           "stage " + std::to_string(st) + " bytes = zerorun estimate", R);
  }
  expect(near(static_cast<double>(b[3].total()) * W, static_cast<double>(b[0].total())), "stage 3 x N ~ stage 0", R);
  for (int st = 1; st <= 3; ++st)
    expect(std::fabs(loss[st] - loss[0]) <= 1e-6 * loss[0], "stage " + std::to_string(st) + " first loss", R);

  // 2. inf/nan on one rank only: every rank skips, weights unchanged.
  {
    Config c = cfg(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
                       "fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 1}})",
                   W);
    Engine e(m, c, *comm, 3);
    auto before = e.master_weights();
    e.after_backward = [&](float* g, int64_t n) {
      if (R == W - 1) g[n - 1] = NAN;
    };
    StepStats s = e.train_step(*data);
    auto after = e.master_weights();
    bool same = true;
    for (auto& [k, t] : before) same = same && std::memcmp(t.raw(), after[k].raw(), t.nbytes()) == 0;
    expect(s.skipped && same, "overflow on one rank skips on all", R);
    e.after_backward = nullptr;
    StepStats s2 = e.train_step(*data);
    expect(!s2.skipped && s2.loss_scale == 128, "scale halved after overflow", R);
  }

  // 3. Stage 3 with activation checkpointing = stage 3 without.
  {
    double l[2];
    for (int ck = 0; ck < 2; ++ck) {
      Config c = cfg(
          R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3, "reduce_bucket_size": 3000}})",
          W);
      if (ck) c.activation_checkpointing = true;
      Engine e(m, c, *comm, 3);
      for (int i = 0; i < 3; ++i) l[ck] = e.train_step(*data).loss;
    }
    expect(l[0] == l[1], "stage 3 + activation checkpointing identical", R);
  }

  int f = failed;
  comm->all_reduce(&f, 1, DType::I32, ReduceOp::Sum);
  if (R == 0) std::printf("engine on %d ranks: %d passed, %d failed\n", W, passed * W, f);
  return f == 0 ? 0 : 1;
}
