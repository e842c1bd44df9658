// The CPU optimizer of issue 34: the vectorised, threaded Adam gives the scalar loop's bits at every thread count
// and weight-decay mode; DeepSpeed's bf16.bf16_master_weights_and_grads / bf16_optimizer_states (the kernel against
// a scalar model of their numerics, the Optimizer's bf16 state, and the config keys' rules).
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/optim_math.h"
#include "tests/common/tiny.h"
#include "zerorun/config.h"
#include "zerorun/engine.h"
#include "zerorun/optim.h"
#include "zerorun/strict_json.h"
#include "zerorun/zero_plan.h"

using namespace zerorun;
using namespace zerorun::testing;

namespace {

struct State {
  std::vector<float> p, g, m, v;
};
State random_state(int64_t n, uint32_t seed) {
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  auto r = [&] { return (seed = seed * 1664525u + 1013904223u) / 4294967296.f - 0.5f; };
  for (int64_t i = 0; i < n; ++i) {
    s.p[i] = round_to(DType::BF16, r());
    s.g[i] = r() * 1e-2f;
    s.m[i] = round_to(DType::BF16, r() * 1e-3f);
    s.v[i] = round_to(DType::BF16, std::abs(r()) * 1e-5f);
  }
  s.g[3] = 0.f, s.g[5] = -0.f, s.p[7] = 0.f;  // exact zeros and a negative zero
  return s;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

}  // namespace

TEST_CASE("CPU Adam: vector clones and threads give the scalar loop's bits", "[optim][cpu_adam]") {
  const int64_t n = 300007;  // odd: every thread's piece and the vector loops' tails
  const int threads_before = omp_get_max_threads();
  for (int mode = 0; mode < 3; ++mode) {  // AdamW, Adam + L2, no decay
    const float wd = mode == 2 ? 0.f : 0.1f;
    State ref = random_state(n, 7u + static_cast<uint32_t>(mode));
    const State init = ref;
    for (int64_t st = 1; st <= 3; ++st)
      kernels::cpu::adam_step_reference(ref.p.data(), ref.g.data(), ref.m.data(), ref.v.data(), n, 1e-3f, 0.9f, 0.999f,
                                        1e-8f, wd, mode == 0, true, st);
    for (int t : {1, 2, 3, 8}) {
      omp_set_num_threads(t);
      State s = init;
      for (int64_t st = 1; st <= 3; ++st)
        kernels::cpu::adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, wd,
                                mode == 0, true, st);
      INFO("mode " << mode << ", " << t << " threads");
      CHECK(same_bits(s.p, ref.p));
      CHECK(same_bits(s.m, ref.m));
      CHECK(same_bits(s.v, ref.v));
    }
  }
  omp_set_num_threads(threads_before);
}

TEST_CASE("CPU Adam with bf16 master weights and gradients, fp32 or bf16 moments", "[optim][cpu_adam][bf16]") {
  const int64_t n = 200003;
  const int threads_before = omp_get_max_threads();
  for (bool bf16_states : {false, true}) {
    State init = random_state(n, 99u);
    // The scalar model: gradient rounded to bf16, the f32 update, p (and m, v with bf16 states) rounded to bf16.
    State ref = init;
    const kernels::AdamCoeffs c = kernels::adam_coeffs(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, true, 1);
    for (int64_t i = 0; i < n; ++i) {
      kernels::adam_elem(ref.p[i], round_to(DType::BF16, ref.g[i]), ref.m[i], ref.v[i], c);
      ref.p[i] = round_to(DType::BF16, ref.p[i]);
      if (bf16_states) ref.m[i] = round_to(DType::BF16, ref.m[i]), ref.v[i] = round_to(DType::BF16, ref.v[i]);
    }
    for (int t : {1, 3}) {
      omp_set_num_threads(t);
      State s = init;
      std::vector<uint16_t> m16(n), v16(n);
      for (int64_t i = 0; i < n; ++i) m16[i] = f32_to_bf16(s.m[i]), v16[i] = f32_to_bf16(s.v[i]);
      void* m = bf16_states ? static_cast<void*>(m16.data()) : s.m.data();
      void* v = bf16_states ? static_cast<void*>(v16.data()) : s.v.data();
      kernels::cpu::adam_step_bf16_master(s.p.data(), s.g.data(), m, v, bf16_states, n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                          0.01f, true, true, 1);
      if (bf16_states)
        for (int64_t i = 0; i < n; ++i) s.m[i] = bf16_to_f32(m16[i]), s.v[i] = bf16_to_f32(v16[i]);
      INFO((bf16_states ? "bf16" : "fp32") << " moments, " << t << " threads");
      if (bf16_states) {
        // bf16 moments take the CPU-only formula (sqrt(v) times 1 / sqrt(bc2), not divided by sqrt(bc2)): within
        // a bf16 ulp of adam_elem's weights and moments (equal nearly everywhere).
        int64_t differ = 0, far = 0;
        for (int64_t i = 0; i < n; ++i) {
          differ += s.p[i] != ref.p[i];
          far += !(std::abs(s.p[i] - ref.p[i]) <= std::ldexp(std::abs(ref.p[i]), -7));
        }
        INFO(differ << " weights differ from adam_elem's");
        CHECK(far == 0);
        CHECK(differ < n / 1000);
        CHECK(same_bits(s.m, ref.m));  // the moments do not see the denominator
        CHECK(same_bits(s.v, ref.v));
      } else {
        CHECK(same_bits(s.p, ref.p));
        CHECK(same_bits(s.m, ref.m));
        CHECK(same_bits(s.v, ref.v));
      }
      // Every weight stays a bf16 value.
      bool all_bf16 = true;
      for (float x : s.p) all_bf16 &= round_to(DType::BF16, x) == x;
      CHECK(all_bf16);
    }
  }
  omp_set_num_threads(threads_before);
}

TEST_CASE(
    "CPU Adam with bf16 master weights and moments: every loop and thread count gives the scalar reference's "
    "bits",
    "[optim][cpu_adam][bf16]") {
  const int64_t n = 300007;  // odd: every thread's piece and the vector loops' tails
  const int threads_before = omp_get_max_threads();
  for (int mode = 0; mode < 3; ++mode) {  // AdamW, Adam + L2, no decay
    const float wd = mode == 2 ? 0.f : 0.1f;
    State init = random_state(n, 31u + static_cast<uint32_t>(mode));
    // Special values: gradients NaN, infinite, subnormal, at a bf16 rounding tie; moments subnormal and tiny.
    init.g[11] = std::nanf(""), init.g[12] = INFINITY, init.g[13] = -INFINITY, init.g[14] = 1e-40f;
    init.g[15] = bf16_to_f32(0x3f81) + std::ldexp(1.f, -16);  // halfway between two bf16 values: ties to even
    init.g[16] = bf16_to_f32(0x3f82) + std::ldexp(1.f, -16);
    init.m[17] = 1e-39f, init.v[17] = 1e-39f, init.v[18] = 0.f, init.m[19] = -1e-38f;
    std::vector<uint16_t> m0(n), v0(n);
    for (int64_t i = 0; i < n; ++i) m0[i] = f32_to_bf16(init.m[i]), v0[i] = f32_to_bf16(init.v[i]);
    std::vector<float> rp = init.p;
    std::vector<uint16_t> rm = m0, rv = v0;
    for (int64_t st = 1; st <= 3; ++st)
      kernels::cpu::adam_step_bf16_master_reference(rp.data(), init.g.data(), rm.data(), rv.data(), true, n, 1e-3f,
                                                    0.9f, 0.999f, 1e-8f, wd, mode == 0, true, st);
    CHECK(std::isnan(rp[11]));
    for (bool avx512 : {true, false}) {
      kernels::cpu::adam_bf16_states_allow_avx512(avx512);
      for (int t : {1, 2, 3, 8}) {
        omp_set_num_threads(t);
        std::vector<float> p = init.p;
        std::vector<uint16_t> m = m0, v = v0;
        for (int64_t st = 1; st <= 3; ++st)
          kernels::cpu::adam_step_bf16_master(p.data(), init.g.data(), m.data(), v.data(), true, n, 1e-3f, 0.9f, 0.999f,
                                              1e-8f, wd, mode == 0, true, st);
        INFO("mode " << mode << ", " << t << " threads, AVX-512 loop " << (avx512 ? "allowed" : "off"));
        CHECK(same_bits(p, rp));
        CHECK(std::memcmp(m.data(), rm.data(), 2 * n) == 0);
        CHECK(std::memcmp(v.data(), rv.data(), 2 * n) == 0);
      }
    }
  }
  kernels::cpu::adam_bf16_states_allow_avx512(true);
  omp_set_num_threads(threads_before);
}

TEST_CASE("Optimizer keeps bf16 moments in 2 bytes and stays near the fp32-state update", "[optim][bf16]") {
  OptimizerConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  const int64_t n = 4096;
  Optimizer o32(oc, n), o16(oc, n, Device::cpu(), true, true);
  auto st = o16.state();
  REQUIRE(st.size() == 2);
  CHECK(st[0].second.dtype() == DType::BF16);
  CHECK(st[0].second.nbytes() == 2 * n);
  CHECK(o32.state()[0].second.nbytes() == 4 * n);
  State a = random_state(n, 5u), b = a;
  for (int k = 0; k < 20; ++k) {
    for (int64_t i = 0; i < n; ++i) a.g[i] = b.g[i] = std::sin(0.37f * i + k) * 1e-2f;
    o32.step(a.p.data(), a.g.data(), oc.lr, oc.beta1);
    o16.step(b.p.data(), b.g.data(), oc.lr, oc.beta1);
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(a.p[i]) - b.p[i]));
  // 20 steps of lr 1e-2 move a weight by up to 0.2; bf16 keeps 8 bits: a few ulps of |p| <= 0.7 (2^-8 = 3.9e-3).
  CHECK(worst < 2e-2);
  CHECK(worst > 0);  // the bf16 path is not the fp32 one
  OptimizerConfig sgd;
  sgd.type = "SGD";
  CHECK_THROWS_WITH(Optimizer(sgd, 8, Device::cpu(), true, false), Catch::Contains("Adam/AdamW"));
}

TEST_CASE("bf16 memory keys: DeepSpeed's rules", "[config][bf16]") {
  auto parse = [](const std::string& t) { return parse_config(parse_json_strict(t, "t.json"), "t.json"); };
  Config c = parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
    "bf16_optimizer_states": true}, "zero_optimization": {"stage": 2}})");
  CHECK(c.bf16_master_weights_and_grads);
  CHECK(c.bf16_optimizer_states);
  ResolveContext ctx;
  resolve_config(c, ctx);
  CHECK(c.precision == Precision::BF16);
  CHECK(c.bf16_optimizer_states);
  // bf16 master weights with fp32 moments: DeepSpeed needs the CPU optimizer (offload_optimizer cpu).
  CHECK_THROWS_WITH(parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_master_weights_and_grads":
    true}, "zero_optimization": {"stage": 2}})"),
                    Catch::Contains("offload_optimizer.device"));
  CHECK_NOTHROW(parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})"));
  CHECK_THROWS_WITH(parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_optimizer_states": true},
    "zero_optimization": {"stage": 2}})"),
                    Catch::Contains("requires 'bf16.bf16_master_weights_and_grads'"));
  CHECK_THROWS_WITH(parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
    "bf16_optimizer_states": true}})"),
                    Catch::Contains("ZeRO stage 1, 2 or 3"));
  CHECK_THROWS_WITH(parse(R"({"train_batch_size": 2, "bf16": {"enabled": true, "bf16_optimizer_state": true}})"),
                    Catch::Contains("bf16_optimizer_states"));  // did-you-mean
  // Not a bf16 run ("auto" on the CPU): the keys do nothing, with a warning.
  Config f = parse(R"({"train_batch_size": 2, "bf16": {"enabled": "auto", "bf16_master_weights_and_grads": true,
    "bf16_optimizer_states": true}, "zero_optimization": {"stage": 1}})");
  resolve_config(f, ctx);
  CHECK(f.precision == Precision::FP32);
  CHECK_FALSE(f.bf16_master_weights_and_grads);
  bool warned = false;
  for (auto& w : f.warnings) warned |= w.find("have no effect") != std::string::npos;
  CHECK(warned);
}

TEST_CASE("zerorun estimate counts the bf16 memory keys as the engine allocates them", "[train][bf16]") {
  Model g = tiny_gpt();
  const double P = static_cast<double>(g.num_params());
  for (bool states : {false, true})
    for (int st = 1; st <= 3; ++st) {
      INFO("stage " << st << (states ? " bf16 master + moments" : " bf16 master"));
      Config c = make_cfg(R"({"train_batch_size": 4, "zero_optimization": {"stage": )" + std::to_string(st) +
                          R"(, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
                          "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": )" +
                          (states ? "true" : "false") + "}}");
      auto comm = make_self_comm();
      Engine e(g, c, *comm, 1);
      const ModelStateBytes b = e.model_state_bytes();
      const zero::StateEstimate est =
          zero::estimate_model_states(P, st, 1, true, false, false, false, -1, true, states);
      auto near = [](double got, double want) { return got >= want && got <= want * 1.02 + 4096; };
      CHECK(near(b.params, est.params));
      CHECK(near(b.grads, est.grads));
      CHECK(near(b.optimizer, est.optimizer));
      CHECK(est.optimizer == Approx((states ? 4 : 8) * P));  // moments only: the compute weights are the master
    }
}
