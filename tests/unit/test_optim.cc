// Schedulers (DeepSpeed formulas, hand-computed values), the dynamic loss
// scaler's state machine, and the optimizer update rules.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "zerorun/optim.h"

using namespace zerorun;

namespace {
LrSchedule sched(const std::string& type, nlohmann::json params, double lr = 0.1) {
  SchedulerConfig s{type, std::move(params)};
  OptimizerConfig o;
  o.lr = lr;
  return LrSchedule(s, o, 100);
}
}  // namespace

// Expected values are hand-computed from DeepSpeed 0.19.5's deepspeed/runtime/lr_schedules.py. at(k) is what
// optimizer step k+1 runs with: at(-1) is what the scheduler's constructor left in the optimizer (DeepSpeed steps the
// scheduler after the optimizer), at(k >= 0) is get_lr() at last_batch_iteration + 1 + k.
TEST_CASE("WarmupLR log and linear (DeepSpeed 0.19.5)", "[optim]") {
  auto s = sched("WarmupLR", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 1.0}, {"warmup_num_steps", 10}});
  CHECK(s.at(-1).lr == 0.0);                         // get_lr() before the start: min_lrs
  CHECK(s.at(0).lr == 0.0);                          // log(1) / log(10)
  CHECK(s.at(4).lr == Approx(0.69897000433601886));  // log(5) / log(10)
  CHECK(s.at(9).lr == Approx(1.0));                  // log(10) / log(10)
  CHECK(s.at(10).lr == 1.0);
  CHECK(s.at(50).lr == 1.0);
  auto l = sched("WarmupLR",
                 {{"warmup_min_lr", 0.1}, {"warmup_max_lr", 0.5}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}});
  CHECK(l.at(-1).lr == Approx(0.1));
  CHECK(l.at(2).lr == Approx(0.1 + 0.4 * 2 / 4));
  CHECK(l.at(4).lr == Approx(0.5));
  // warmup_max_lr left out: WarmupLR takes the optimizer's lr (0.1 here); warmup_num_steps 0 or 1 means 2.
  auto d = sched("WarmupLR", {{"warmup_num_steps", 0}, {"warmup_type", "linear"}}, 0.1);
  CHECK(d.at(0).lr == 0.0);
  CHECK(d.at(1).lr == Approx(0.05));  // 1 / 2
  CHECK(d.at(2).lr == Approx(0.1));
  // An unknown warmup_type is log, as DeepSpeed falls back to.
  auto u = sched("WarmupLR", {{"warmup_max_lr", 1.0}, {"warmup_num_steps", 10}, {"warmup_type", "cosine"}});
  CHECK(u.at(4).lr == Approx(0.69897000433601886));
}

TEST_CASE("last_batch_iteration starts a schedule part-way; step 1 keeps the optimizer's lr (DeepSpeed 0.19.5)",
          "[optim]") {
  const nlohmann::json p = {
      {"warmup_min_lr", 0.0}, {"warmup_max_lr", 1.0}, {"warmup_num_steps", 10}, {"warmup_type", "linear"}};
  auto base = sched("WarmupLR", p);
  nlohmann::json q = p;
  q["last_batch_iteration"] = 4;  // the constructor leaves the optimizer alone; the next step() is iteration 5
  auto shifted = sched("WarmupLR", q, 0.25);
  CHECK(shifted.at(-1).lr == 0.25);
  CHECK(!shifted.at(-1).beta1);
  CHECK(shifted.at(0).lr == Approx(0.5));  // iteration 5: 5 / 10
  CHECK(shifted.at(5).lr == Approx(1.0));  // iteration 10
  for (int it = 0; it < 12; ++it) CHECK(shifted.at(it).lr == base.at(it + 5).lr);
  q["last_batch_iteration"] = -1;  // the default
  auto same = sched("WarmupLR", q);
  for (int it = -1; it < 12; ++it) CHECK(same.at(it).lr == base.at(it).lr);
  // OneCycle part-way: step 1 runs at the optimizer's lr and betas, then the cycle from iteration 5.
  auto oc = sched(
      "OneCycle",
      {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.1}, {"cycle_first_step_size", 10}, {"last_batch_iteration", 4}}, 0.3);
  CHECK(oc.at(-1).lr == 0.3);
  CHECK(!oc.at(-1).beta1);
  CHECK(oc.at(0).lr == Approx(0.1 + 1.0 * 0.6));  // iteration 5: batch 6, x = 0.3, scale 0.6
}

TEST_CASE("WarmupDecayLR decays linearly to zero (DeepSpeed 0.19.5)", "[optim]") {
  auto s = sched("WarmupDecayLR", {{"warmup_min_lr", 0.0},
                                   {"warmup_max_lr", 1.0},
                                   {"warmup_num_steps", 10},
                                   {"total_num_steps", 110},
                                   {"warmup_type", "linear"}});
  CHECK(s.at(-1).lr == 0.0);
  CHECK(s.at(5).lr == Approx(0.5));
  CHECK(s.at(10).lr == Approx(1.0));  // (110 - 10) / 100
  CHECK(s.at(60).lr == Approx(0.5));
  CHECK(s.at(110).lr == 0.0);
  CHECK(s.at(200).lr == 0.0);
  // warmup_max_lr left out: WarmupDecayLR's own default 0.001 (not the optimizer's lr).
  auto d = sched("WarmupDecayLR", {{"warmup_num_steps", 2}, {"total_num_steps", 20}, {"warmup_type", "linear"}}, 0.1);
  CHECK(d.at(5).lr == Approx(0.001 * 15.0 / 18.0));
  // total < warmup: gamma = max(0, (total - it) / max(1, total - warmup)) once the warmup is over.
  auto t = sched("WarmupDecayLR",
                 {{"warmup_max_lr", 1.0}, {"warmup_num_steps", 10}, {"total_num_steps", 5}, {"warmup_type", "linear"}});
  CHECK(t.at(9).lr == Approx(0.9));
  CHECK(t.at(10).lr == 0.0);
}

TEST_CASE("WarmupCosineLR: floor after total, total == warmup, warmup_min_ratio (DeepSpeed 0.19.5)", "[optim]") {
  auto s = sched("WarmupCosineLR",
                 {{"total_num_steps", 20},
                  {"warmup_num_steps", 10},
                  {"warmup_min_ratio", 0.0},
                  {"cos_min_ratio", 0.0},
                  {"warmup_type", "linear"}},
                 2.0);
  CHECK(s.at(-1).lr == 0.0);  // get_lr() before the start returns 0
  CHECK(s.at(5).lr == Approx(1.0));
  // iteration 14: real_last = 5, real_total = 10 -> (1 + cos(pi/2)) / 2 = 0.5
  CHECK(s.at(14).lr == Approx(1.0));
  CHECK(s.at(19).lr == Approx(0.0).margin(1e-12));
  // Past total_num_steps the progress is clamped to 1: the lr stays at the floor (older DeepSpeed climbed back up).
  for (int it : {20, 25, 30, 39, 1000}) CHECK(s.at(it).lr == Approx(0.0).margin(1e-12));
  auto floor =
      sched("WarmupCosineLR", {{"total_num_steps", 20}, {"warmup_num_steps", 10}, {"cos_min_ratio", 0.1}}, 2.0);
  CHECK(floor.at(19).lr == Approx(0.2));
  CHECK(floor.at(500).lr == Approx(0.2));
  CHECK(floor.at(4).lr == Approx(2.0 * 0.69897000433601886));  // log warmup: log(5) / log(10)
  // total == warmup: real_total = max(1, 0) = 1, so every step after the warmup is at cos_min_ratio.
  auto eq = sched(
      "WarmupCosineLR",
      {{"total_num_steps", 10}, {"warmup_num_steps", 10}, {"cos_min_ratio", 0.1}, {"warmup_type", "linear"}}, 2.0);
  CHECK(eq.at(9).lr == Approx(1.8));
  CHECK(eq.at(10).lr == Approx(0.2));
  CHECK(eq.at(50).lr == Approx(0.2));
  // warmup_min_ratio > 0: step 1 still runs at 0 (the constructor's get_lr()), step 2 at the ratio.
  auto wm = sched(
      "WarmupCosineLR",
      {{"total_num_steps", 100}, {"warmup_num_steps", 10}, {"warmup_min_ratio", 0.2}, {"warmup_type", "linear"}}, 2.0);
  CHECK(wm.at(-1).lr == 0.0);
  CHECK(wm.at(0).lr == Approx(0.4));        // 0.2 + 0 * 0.8
  CHECK(wm.at(5).lr == Approx(2.0 * 0.6));  // 0.2 + 0.5 * 0.8
  // last_batch_iteration with warmup_min_ratio: the optimizer's lr first, then iteration L + 1.
  auto lw = sched("WarmupCosineLR",
                  {{"total_num_steps", 100},
                   {"warmup_num_steps", 10},
                   {"warmup_min_ratio", 0.2},
                   {"warmup_type", "linear"},
                   {"last_batch_iteration", 1}},
                  2.0);
  CHECK(lw.at(-1).lr == 2.0);
  CHECK(lw.at(0).lr == Approx(2.0 * (0.2 + 0.2 * 0.8)));  // iteration 2
}

TEST_CASE("OneCycle lr and momentum, decay (DeepSpeed 0.19.5)", "[optim]") {
  auto s = sched("OneCycle", {{"cycle_min_lr", 0.1},
                              {"cycle_max_lr", 1.1},
                              {"cycle_first_step_size", 10},
                              {"cycle_momentum", true},
                              {"cycle_min_mom", 0.8},
                              {"cycle_max_mom", 0.9},
                              {"decay_step_size", 5},
                              {"decay_lr_rate", 1.0}});
  // The constructor sets lr = cycle_min_lr and betas = (cycle_min_mom, 0.99).
  CHECK(s.at(-1).lr == Approx(0.1));
  CHECK(*s.at(-1).beta1 == Approx(0.8));
  CHECK(s.at(0).lr == Approx(0.1 + 1.0 * 0.1));  // batch 1: x = 1/20, scale 0.1
  CHECK(*s.at(0).beta1 == Approx(0.9 - 0.1 * 0.1));
  CHECK(s.at(4).lr == Approx(0.6));  // iteration 5 of a 10-step rise
  CHECK(*s.at(4).beta1 == Approx(0.85));
  CHECK(s.at(9).lr == Approx(1.1));
  CHECK(*s.at(9).beta1 == Approx(0.8));
  CHECK(s.at(14).lr == Approx(0.6));
  CHECK(s.at(19).lr == Approx(0.1));                    // batch 20 ends the cycle
  CHECK(s.at(21).lr == Approx(0.1 / (1 + 1.0 * 0.4)));  // decay interval (21 - 20 + 1) / 5, not floored
  CHECK(s.at(24).lr == Approx(0.1 / (1 + 1.0 * 1.0)));  // 5 steps into decay
  CHECK(*s.at(24).beta1 == Approx(0.9));                // decay_mom_rate 0: cycle_max_mom
  // decay_step_size 0: no decay at all.
  auto nd =
      sched("OneCycle",
            {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.1}, {"cycle_first_step_size", 10}, {"decay_lr_rate", 1.0}});
  CHECK(nd.at(100).lr == Approx(0.1));
  // Momentum decay: beta1 = cycle_max_mom * (1 + decay_mom_rate * interval).
  auto md = sched("OneCycle", {{"cycle_min_lr", 0.1},
                               {"cycle_max_lr", 1.1},
                               {"cycle_first_step_size", 10},
                               {"decay_step_size", 5},
                               {"decay_mom_rate", 0.1}});
  CHECK(*md.at(24).beta1 == Approx(0.9 * 1.1));
  // cycle_momentum false: the optimizer's own beta1.
  auto nm = sched("OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.1}, {"cycle_momentum", false}});
  CHECK(!nm.at(-1).beta1);
  CHECK(!nm.at(3).beta1);
}

TEST_CASE("OneCycle stair counts hold lr and momentum flat (DeepSpeed 0.19.5)", "[optim]") {
  // first 10 steps in 2 stairs, second 5 steps in 5 stairs (total 15).
  auto s = sched("OneCycle", {{"cycle_min_lr", 0.0},
                              {"cycle_max_lr", 1.0},
                              {"cycle_first_step_size", 10},
                              {"cycle_second_step_size", 5},
                              {"cycle_first_stair_count", 2},
                              {"cycle_second_stair_count", 5},
                              {"cycle_min_mom", 0.8},
                              {"cycle_max_mom", 0.9}});
  CHECK(s.at(3).lr == 0.0);  // batch 4: floor(4 * 2 / 10) / 2 = 0 (continuous: 0.4)
  CHECK(*s.at(3).beta1 == Approx(0.9));
  CHECK(s.at(4).lr == Approx(0.5));  // batch 5: floor(1.0) / 2
  CHECK(*s.at(4).beta1 == Approx(0.85));
  CHECK(s.at(8).lr == Approx(0.5));   // batch 9: floor(1.8) / 2
  CHECK(s.at(9).lr == Approx(1.0));   // batch 10: the peak, exactly
  CHECK(s.at(10).lr == Approx(0.8));  // batch 11: floor((15 - 11) * 5 / 5) / 5
  CHECK(s.at(12).lr == Approx(0.4));  // batch 13
  // cycle_second_stair_count left out = cycle_first_stair_count.
  auto d = sched(
      "OneCycle",
      {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 10}, {"cycle_first_stair_count", 2}});
  CHECK(d.at(12).lr == Approx(0.5));  // batch 13: floor((20 - 13) * 2 / 10) / 2 (continuous: 0.7)
  CHECK(d.at(14).lr == Approx(0.5));  // batch 15: floor(1.0) / 2
  CHECK(d.at(16).lr == 0.0);          // batch 17: floor(0.6) / 2
}

TEST_CASE("LRRangeTest continuous and staircase (DeepSpeed 0.19.5)", "[optim]") {
  auto s = sched("LRRangeTest",
                 {{"lr_range_test_min_lr", 0.01}, {"lr_range_test_step_size", 10}, {"lr_range_test_step_rate", 2.0}});
  CHECK(s.at(-1).lr == Approx(0.01));
  CHECK(s.at(4).lr == Approx(0.01 * (1 + 2.0 * 0.5)));
  auto st = sched("LRRangeTest", {{"lr_range_test_min_lr", 0.01},
                                  {"lr_range_test_step_size", 10},
                                  {"lr_range_test_step_rate", 2.0},
                                  {"lr_range_test_staircase", true}});
  CHECK(st.at(4).lr == Approx(0.01));
  CHECK(st.at(9).lr == Approx(0.03));
  CHECK(st.at(19).lr == Approx(0.05));
}

TEST_CASE("dynamic loss scaler: hysteresis, growth window, error at min scale", "[optim]") {
  LossScaleConfig c;
  c.initial_scale_power = 4;  // 16
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  c.min_loss_scale = 4;
  LossScaler s(c, true);
  REQUIRE(s.scale() == 16);
  s.update(true);  // hysteresis 2 -> 1, no shrink
  REQUIRE(s.scale() == 16);
  s.update(true);  // shrink
  REQUIRE(s.scale() == 8);
  s.update(false);  // iter 2, last overflow 1: (2-1)%3 != 0
  s.update(false);
  REQUIRE(s.scale() == 8);
  s.update(false);  // (4-1)%3 == 0 -> grow
  REQUIRE(s.scale() == 16);
  s.update(true);  // hysteresis was reset to 2 on growth -> 1
  REQUIRE(s.scale() == 16);
  s.update(true);
  s.update(true);
  REQUIRE(s.scale() == 4);
  REQUIRE_THROWS_WITH(s.update(true), Catch::Contains("minimum"));
  LossScaleConfig st;
  st.loss_scale = 128;
  LossScaler fixed(st, true);
  fixed.update(true);
  REQUIRE(fixed.scale() == 128);
  REQUIRE(LossScaler(c, false).scale() == 1.0);
}

TEST_CASE("adam matches the closed form; adamw vs L2 decay differ", "[optim]") {
  float p = 1.f, g = 0.5f, m = 0.f, v = 0.f;
  kernels::cpu::adam_step(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.f, true, true, 1);
  // First step with bias correction moves by lr * sign(g).
  REQUIRE(p == Approx(0.9f).epsilon(1e-6));
  float p1 = 1.f, m1 = 0, v1 = 0, p2 = 1.f, m2 = 0, v2 = 0;
  kernels::cpu::adam_step(&p1, &g, &m1, &v1, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, true, true, 1);
  kernels::cpu::adam_step(&p2, &g, &m2, &v2, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, false, true, 1);
  REQUIRE(p1 == Approx(1.f - 0.1f * 0.1f - 0.1f).epsilon(1e-6));
  REQUIRE(p2 == Approx(0.9f).epsilon(1e-6));  // L2 term folds into g; still a unit step
  float q = 1.f, buf = 0.f;
  kernels::cpu::sgd_step(&q, &g, &buf, 1, 0.1f, 0.9f, 0.f, 0.f, false, true);
  kernels::cpu::sgd_step(&q, &g, &buf, 1, 0.1f, 0.9f, 0.f, 0.f, false, false);
  REQUIRE(q == Approx(1.f - 0.05f - 0.1f * (0.9f * 0.5f + 0.5f)));
}

TEST_CASE("AdamW with rounded outputs: the update, then the weights rounded to f32 values and 16-bit bits", "[optim]") {
  auto& be = kernels::cpu_backend();
  const int64_t n = 1001;
  std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
  for (int64_t i = 0; i < n; ++i) p[i] = 0.37f * std::sin(0.1f * i) + 1e-3f * i, g[i] = std::cos(0.3f * i);
  std::vector<float> p2 = p, m2 = m, v2 = v;
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<float> r32(n);
    std::vector<uint16_t> r16(n);
    be.adam_step(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, true, true, 1);
    be.adam_step_rounded(p2.data(), g.data(), m2.data(), v2.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, true, true, 1,
                         dt, r32.data(), r16.data());
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(p2[i] == p[i]);  // the fp32 master is updated exactly as by adam_step
      REQUIRE(m2[i] == m[i]);
      REQUIRE(v2[i] == v[i]);
      const uint16_t want = dt == DType::BF16 ? f32_to_bf16(p[i]) : f32_to_f16(p[i]);
      REQUIRE(r16[i] == want);
      REQUIRE(r32[i] == round_to(dt, p[i]));
    }
  }
  std::vector<uint16_t> h(3);
  const float src[3] = {1.f, 3.14159f, -65504.f};
  REQUIRE_THROWS_WITH(be.round_to16(DType::F32, src, h.data(), nullptr, 3), Catch::Contains("bf16 or f16"));
}

TEST_CASE("Rounded f32 copies by slot: only kept 256-element chunks, compact, from any base", "[optim]") {
  // The engine's compact compute copy: chunk k of the flat layout at slot slots[k] of a compact buffer (or none).
  auto& be = kernels::cpu_backend();
  const int64_t n = 900, base = 300;  // elements [300, 1200): chunks 1..4
  const std::vector<int32_t> slots = {-1, 0, -1, 1, 2};
  std::vector<float> src(n);
  for (int64_t i = 0; i < n; ++i) src[i] = 0.37f * std::sin(0.1f * i) + 1e-3f * i;
  auto expect = [&](const std::vector<float>& c, const std::vector<uint16_t>& h, const std::vector<float>& w) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = base + i, k = slots[static_cast<size_t>(e / 256)];
      REQUIRE(h[i] == f32_to_bf16(w[i]));
      if (k >= 0) REQUIRE(c[static_cast<size_t>(256 * k + e % 256)] == round_to(DType::BF16, w[i]));
    }
    // Slot 0 holds chunk 1 = elements [256, 512): its first 44 precede the range and stay untouched.
    for (int j = 0; j < 44; ++j) REQUIRE(c[static_cast<size_t>(j)] == -7.f);
  };
  {
    std::vector<float> c(3 * 256, -7.f);
    std::vector<uint16_t> h(n);
    be.round_to16(DType::BF16, src.data(), h.data(), c.data(), n, slots.data(), base);
    expect(c, h, src);
    int64_t written = 0;
    for (float x : c) written += x != -7.f;
    REQUIRE(written == (512 - 300) + 256 + (1200 - 1024));  // chunk 2's elements went nowhere
  }
  for (const char* type : {"AdamW", "SGD"}) {  // both optimizers' rounded updates honour the map
    INFO(type);
    OptimizerConfig oc;
    oc.type = type;
    oc.lr = 1e-2;
    oc.momentum = 0.9;
    Optimizer opt(oc, n);
    std::vector<float> p = src, g(n), c(3 * 256, -7.f);
    for (int64_t i = 0; i < n; ++i) g[i] = std::cos(0.3f * i);
    std::vector<uint16_t> h(n);
    RoundedOut out;
    out.dt = DType::BF16, out.f32 = c.data(), out.h = h.data(), out.f32_slots = slots.data(), out.f32_base = base;
    opt.step(p.data(), g.data(), 1e-2, 0.9, out);
    REQUIRE(p != src);
    expect(c, h, p);
  }
  std::vector<float> c(n);
  REQUIRE_THROWS_WITH(be.round_copies(DType::BF16, src.data(), c.data(), nullptr, n, slots.data(), base),
                      Catch::Contains("need the 16-bit copy"));
  // widen16_slots: the compact copy rebuilt from the (all-gathered) 16-bit copy of the whole flat layout equals the
  // one the rounding wrote; chunks without a slot are not written.
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t total = 5 * 256 - 17;  // the flat layout, its last chunk partial
    std::vector<float> flat(total), made(3 * 256, -7.f), widened(3 * 256, -7.f);
    for (int64_t i = 0; i < total; ++i) flat[i] = 0.37f * std::sin(0.1f * i) + 1e-3f * i;
    std::vector<uint16_t> h(total);
    be.round_to16(dt, flat.data(), h.data(), made.data(), total, slots.data(), 0);
    be.widen16_slots(dt, h.data(), widened.data(), total, slots.data());
    REQUIRE(widened == made);
    // Slots 0..2 hold chunks 1, 3 and 4, written in full but for the 17 elements past the layout's end.
    REQUIRE(std::count(widened.begin(), widened.end(), -7.f) == 17);
  }
  REQUIRE_THROWS_WITH(be.widen16_slots(DType::F32, nullptr, nullptr, 1, slots.data()), Catch::Contains("bf16 or f16"));
}
