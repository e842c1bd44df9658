// Every CUDA op against the CPU op (forward outputs, input and parameter
// gradients), plus the optimizer/reduction kernels. Exits 77 (ctest: skipped)
// when no GPU is visible; tests/run_gpu.sh runs it on the device machine.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/flash_attention.h"
#include "op_compare.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/graph.h"
#include "zerorun/rng.h"

using namespace zerorun;

using namespace zerorun::cuda_test;

TEST_CASE("16-bit activation storage: every op reading or writing it matches the CPU op", "[cuda]") {
  for (DType dt : {DType::BF16, DType::F16}) {
    MatmulDtype mode(dt);
    Rng r(21);
    const Storage16 all{{true}, true, true, true, true};
    compare_op16("linear", {}, {rnd({4, 33, 96}, r)}, {{"weight", rnd({80, 96}, r)}, {"bias", rnd({80}, r)}}, all, dt);
    compare_op16("linear", {}, {rnd({70, 64}, r)}, {{"weight", rnd({48, 64}, r)}}, {{false}, false, true, true, false},
                 dt);
    compare_op16("linear", {}, {rnd({3, 400, 64}, r)}, {{"weight", rnd({264, 64}, r)}, {"bias", rnd({264}, r)}}, all,
                 dt);  // the one-kernel 16-bit bias gradient: two column blocks, 19 row chunks
    for (auto* a : {"gelu", "silu", "relu"}) compare_op16(a, {}, {rnd({9, 256}, r, 3.0)}, {}, all, dt);
    compare_op16("gelu", {}, {rnd({5, 100}, r, 3.0)}, {}, {{false}, false, true, true, false}, dt);
    for (int64_t C : {200, 768, 1100, 1600, 1002})
      compare_op16("layernorm", {{"eps", 1e-5}}, {rnd({6, 37, C}, r)}, {{"weight", rnd({C}, r)}, {"bias", rnd({C}, r)}},
                   {{false}, true, true, true, true}, dt);
    // Head size 64: the tensor-core kernels read and write 16 bits (257 rows: a partial last tile).
    // rope: 16-bit on each side alone and on all sides (grouped-query: a 16-bit key/value gradient sums copies).
    for (const Storage16& st :
         {all, Storage16{{true}, false, false, false, false}, Storage16{{false}, true, false, false, true},
          Storage16{{false}, false, true, true, false}})
      compare_op16("rope", {{"n_head", 8}, {"n_kv_head", 2}}, {rnd({2, 37, (8 + 4) * 64}, r)}, {}, st, dt);
    compare_op16("attention", {{"n_head", 2}}, {rnd({2, 257, 3 * 128}, r, 2.0)}, {}, all, dt);
    compare_op16("attention", {{"n_head", 3}}, {rnd({1, 100, 3 * 192}, r)}, {}, {{false}, false, true, true, false},
                 dt);
    compare_op16("attention", {{"n_head", 2}}, {rnd({2, 70, 3 * 128}, r)}, {}, {{true}, true, false, false, true}, dt);
    // Other head sizes widen 16-bit inputs for the fp32 kernels and write f32.
    compare_op16("attention", {{"n_head", 4}}, {rnd({2, 50, 3 * 128}, r)}, {}, {{true}, true, true, true, false}, dt);
    compare_op16("attention", {{"n_head", 1}}, {rnd({1, 33, 3 * 160}, r)}, {}, {{true}, true, true, true, false}, dt);
    // SwiGLU: 16 bits on every side, on the inputs alone, on the output alone, on the gradients alone; an odd
    // count (the scalar kernel).
    for (const Storage16& st :
         {Storage16{{true, true}, true, true, true, true}, Storage16{{true, false}, false, false, false, false},
          Storage16{{false, false}, true, false, false, true}, Storage16{{false, false}, false, true, true, false}})
      compare_op16("swiglu", {}, {rnd({9, 256}, r, 3.0), rnd({9, 256}, r, 2.0)}, {}, st, dt);
    compare_op16("swiglu", {}, {rnd({5, 101}, r, 3.0), rnd({5, 101}, r)}, {}, {{true, true}, true, true, true, true},
                 dt);
    compare_op16("mul", {}, {rnd({9, 256}, r, 3.0), rnd({9, 256}, r, 2.0)}, {}, {{true, true}, true, true, true, true},
                 dt);
    compare_op16("mul", {}, {rnd({5, 101}, r), rnd({5, 101}, r)}, {}, {{false, true}, false, true, true, false}, dt);
    // rmsnorm (the layernorm kernels without centring): a 16-bit output for the products, a 16-bit dy.
    for (int64_t C : {200, 768, 1002, 2048, 2050})
      compare_op16("rmsnorm", {{"eps", 1e-6}}, {rnd({6, 37, C}, r)}, {{"weight", rnd({C}, r)}},
                   {{false}, true, true, true, true}, dt);
    compare_op16("add", {}, {rnd({4, 50, 64}, r), rnd({4, 50, 64}, r)}, {}, {{false, false}, false, false, true, false},
                 dt);
    compare_op16("cross_entropy", {}, {rnd({4, 30, 1000}, r, 4.0), ids({4, 30}, 1000, r)}, {},
                 {{true, false}, false, false, true, false}, dt);
  }
}

TEST_CASE("tensor-core attention backward: the one-kernel path (dQ by atomics) equals the two atomic-free kernels",
          "[cuda]") {
  // Both paths, every variant of the one-kernel path, for every gradient form (16-bit written, f32 written, f32
  // added into), 257 rows (a partial tile of 64 and of 128 keys), three heads; the one-kernel paths' dQ sums the
  // same rounded products in another order.
  const int64_t B = 2, T = 257, H = 3, C = 64 * H, n3 = B * T * 3 * C, n = B * T * C;
  Rng r(5);
  auto bits16 = [&](int64_t count, double scale) { return to16(rnd({count}, r, scale), DType::BF16).to(kGpu); };
  Tensor qkv = bits16(n3, 2.0), dout = bits16(n, 1.0), start = rnd({n3}, r).to(kGpu);
  Tensor out = Tensor::uninit({n}, DType::BF16, MemCategory::Buffers, kGpu);
  Tensor lse = Tensor::uninit({B * H * T}, DType::F32, MemCategory::Buffers, kGpu);
  Tensor delta = Tensor::uninit({B * H * T}, DType::F32, MemCategory::Buffers, kGpu);
  Tensor dq_acc = Tensor::uninit({n}, DType::F32, MemCategory::Buffers, kGpu);
  auto q16 = [](const Tensor& t) { return static_cast<uint16_t*>(t.raw()); };
  kernels::AttnDims d;
  d.B = B, d.T = T, d.H = d.K = H, d.D = 64, d.scale = 0.125f;
  kernels::flash::tc_forward(true, q16(qkv), nullptr, q16(out), lse.f32(), d);
  for (int form = 0; form < 3; ++form) {  // 0: 16-bit, 1: f32 written, 2: f32 added into `start`
    Tensor ref;
    for (int run = 0; run <= kernels::flash::tc_backward_configs(64); ++run) {  // the two kernels, then each variant
      const bool fused = run > 0;
      Tensor g = form == 0 ? Tensor::uninit({n3}, DType::BF16, MemCategory::Buffers, kGpu)
                           : (form == 2 ? start.clone(MemCategory::Buffers)
                                        : Tensor::uninit({n3}, DType::F32, MemCategory::Buffers, kGpu));
      kernels::flash::tc_backward(true, q16(qkv), nullptr, q16(out), lse.f32(), q16(dout), form ? g.f32() : nullptr,
                                  form ? nullptr : q16(g), form == 2, delta.f32(), fused ? dq_acc.f32() : nullptr, d,
                                  fused ? run - 1 : 0);
      if (!fused) {
        ref = as_f32(g);
        continue;
      }
      close(ref, as_f32(g), form ? 2e-5 : 8e-3,
            "attention backward, form " + std::to_string(form) + ", one-kernel variant " + std::to_string(run - 1));
    }
  }
}

TEST_CASE("deterministic mode: the embedding gradient by sort matches the CPU and is the same bits every run",
          "[cuda]") {
  // Many repeats of few ids (up to ~500 rows into one, over many 32-position chunks), one id filling 40% of the
  // batch among many that appear once or twice (runs inside a chunk and runs across chunk edges), fewer positions
  // than one chunk, ids outside the table (skipped), a table that already holds a gradient (added to); 16-byte
  // rows (C = 768) and 4-byte ones (C = 50).
  auto& gpu = kernels::backend(kGpu);
  auto& cpu = kernels::cpu_backend();
  Rng r(8);
  const bool was = gpu.deterministic();
  struct Shape {
    int64_t C, N, V;
    bool heavy;
  };
  for (const Shape& sh : {Shape{768, 5000, 11, false}, Shape{50, 5000, 11, false}, Shape{768, 4099, 3000, true},
                          Shape{50, 4099, 3000, true}, Shape{768, 21, 2, false}}) {
    const int64_t C = sh.C, N = sh.N, V = sh.V;
    Tensor id = ids({N}, V, r), dout = rnd({N, C}, r), start = rnd({V, C}, r);
    if (sh.heavy)
      for (int64_t n = 0; n < N; ++n)
        if (n % 5 < 2) id.i32()[n] = 17;
    id.i32()[7] = static_cast<int32_t>(V), id.i32()[std::min<int64_t>(4001, N - 1)] = -3;
    Tensor want = start.clone(MemCategory::Buffers);  // the CPU kernel takes checked ids only: skip the others here
    Tensor ok_ids = id.clone(MemCategory::Buffers), ok_dout = dout.clone(MemCategory::Buffers);
    for (int64_t n : {int64_t{7}, std::min<int64_t>(4001, N - 1)}) {
      ok_ids.i32()[n] = 0;
      for (int64_t c = 0; c < C; ++c) ok_dout.f32()[n * C + c] = 0.f;
    }
    cpu.embedding_bwd(ok_ids.i32(), ok_dout.f32(), want.f32(), N, C, V);
    Tensor idg = id.to(kGpu), doutg = dout.to(kGpu);
    Tensor first;
    for (int mode = 0; mode < 3; ++mode) {  // deterministic twice, then atomics
      gpu.set_deterministic(mode < 2);
      Tensor got = start.to(kGpu);
      gpu.embedding_bwd(idg.i32(), doutg.f32(), got.f32(), N, C, V);
      close(want, got, 2e-6,
            "embedding backward, C " + std::to_string(C) + ", N " + std::to_string(N) + ", V " + std::to_string(V) +
                (mode < 2 ? ", by sort" : ", atomics"));
      Tensor h = got.to(Device::cpu());
      if (mode == 0) first = h;
      if (mode == 1) REQUIRE(std::memcmp(first.raw(), h.raw(), h.nbytes()) == 0);
    }
  }
  gpu.set_deterministic(was);
}

TEST_CASE("cuda ops match cpu ops", "[cuda]") {
  Rng r(1);
  compare_op("linear", {}, {rnd({4, 33, 96}, r)}, {{"weight", rnd({80, 96}, r)}, {"bias", rnd({80}, r)}});
  compare_op("matmul", {}, {rnd({3, 17, 24}, r), rnd({3, 24, 19}, r)}, {});
  compare_op("matmul", {}, {rnd({3, 17, 24}, r), rnd({24, 19}, r)}, {});
  compare_op("add", {}, {rnd({4, 50, 64}, r), rnd({4, 50, 64}, r)}, {});
  compare_op("add", {}, {rnd({4, 50, 64}, r), rnd({64}, r)}, {});
  compare_op("mul", {}, {rnd({7, 130}, r), rnd({7, 130}, r)}, {});
  for (auto* a : {"gelu", "relu", "silu"}) compare_op(a, {}, {rnd({9, 257}, r, 3.0)}, {});
  compare_op("layernorm", {{"eps", 1e-5}}, {rnd({6, 37, 200}, r)},
             {{"weight", rnd({200}, r)}, {"bias", rnd({200}, r)}});
  // The 16-byte kernels' register widths (C % 4 == 0, up to 2048), the 4-byte ones (1002) and past both.
  for (int64_t C : {500, 768, 1000, 1002, 1100, 1600, 2048, 2052, 2050})
    compare_op("layernorm", {{"eps", 1e-5}}, {rnd({3, 45, C}, r)}, {{"weight", rnd({C}, r)}, {"bias", rnd({C}, r)}});
  for (int64_t C : {200, 768, 1002, 2048, 2052, 2050})
    compare_op("rmsnorm", {{"eps", 1e-6}}, {rnd({3, 45, C}, r)}, {{"weight", rnd({C}, r)}});
  compare_op("swiglu", {}, {rnd({7, 130}, r, 3.0), rnd({7, 130}, r)}, {});
  compare_op("swiglu", {}, {rnd({3, 37}, r, 3.0), rnd({3, 37}, r)}, {});
  compare_op("attention", {{"n_head", 4}}, {rnd({3, 70, 3 * 64}, r)}, {}, 5e-5);   // head size 16
  compare_op("attention", {{"n_head", 2}}, {rnd({2, 97, 3 * 128}, r)}, {}, 5e-5);  // 64
  compare_op("attention", {{"n_head", 1}}, {rnd({1, 45, 3 * 100}, r)}, {}, 5e-5);  // 100 (the 128 kernel)
  compare_op("attention", {{"n_head", 1}}, {rnd({1, 33, 3 * 160}, r)}, {}, 5e-5);  // 160: materialised path
  // rope: multi-head, grouped-query (a key/value head's gradient sums 4 copies) and multi-query, odd lengths.
  compare_op("rope", {{"n_head", 4}}, {rnd({3, 70, (4 + 8) * 16}, r)}, {}, 1e-5);
  compare_op("rope", {{"n_head", 8}, {"n_kv_head", 2}, {"theta", 500000.0}}, {rnd({2, 97, (8 + 4) * 64}, r)}, {}, 1e-5);
  compare_op("rope", {{"n_head", 3}, {"n_kv_head", 1}}, {rnd({1, 33, (3 + 2) * 10}, r)}, {}, 1e-5);
  compare_op("embedding", {}, {ids({4, 40}, 300, r)}, {{"weight", rnd({300, 48}, r)}}, 1e-5);
  compare_op("embedding", {{"position", true}}, {ids({4, 40}, 300, r)}, {{"weight", rnd({64, 48}, r)}}, 1e-5);
  compare_op("cross_entropy", {}, {rnd({4, 30, 1000}, r, 4.0), ids({4, 30}, 1000, r)}, {}, 2e-5);
  compare_op("mse", {}, {rnd({33, 65}, r), rnd({33, 65}, r)}, {});
}

TEST_CASE("cuda ops of today's decoders match cpu ops: qk_norm, Gemma's norms, geglu, scale, softcap, scaled rope",
          "[cuda]") {
  Rng r(31);
  // qk_norm per head (Qwen3; Gemma 3's 1 + w) and over the full width (OLMo-2), more rows than one weight-gradient
  // chunk (64), head sizes 64, 128 and 256.
  for (int64_t D : {64, 128, 256})
    for (double offset : {0.0, 1.0})
      compare_op("qk_norm", {{"n_head", 4}, {"n_kv_head", 2}, {"eps", 1e-6}, {"offset", offset}},
                 {rnd({3, 45, 8 * D}, r)}, {{"q_weight", rnd({D}, r)}, {"k_weight", rnd({D}, r)}});
  compare_op("qk_norm", {{"n_head", 8}, {"n_kv_head", 2}, {"eps", 1e-6}, {"full", true}}, {rnd({2, 70, 12 * 64}, r)},
             {{"q_weight", rnd({8 * 64}, r)}, {"k_weight", rnd({2 * 64}, r)}});
  for (int64_t C : {200, 2048})
    compare_op("rmsnorm", {{"eps", 1e-6}, {"offset", 1.0}}, {rnd({3, 45, C}, r)}, {{"weight", rnd({C}, r)}});
  compare_op("geglu", {}, {rnd({7, 130}, r, 3.0), rnd({7, 130}, r)}, {});
  compare_op("scale", {{"factor", 45.254833995939045}}, {rnd({5, 77}, r)}, {});
  compare_op("softcap", {{"cap", 30.0}}, {rnd({5, 77}, r, 80.0)}, {});
  // rope: transformers' scaled tables (the same f32 inverse frequencies on both sides) and k/v heads in place.
  const json scalings[] = {json(),
                           {{"rope_type", "linear"}, {"factor", 8.0}},
                           {{"rope_type", "dynamic"}, {"factor", 2.0}},
                           {{"rope_type", "llama3"},
                            {"factor", 32.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}},
                           {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}};
  for (const json& sc : scalings)
    for (bool repeat : {true, false}) {
      json a = {
          {"n_head", 8}, {"n_kv_head", 2}, {"theta", 500000.0}, {"repeat_kv", repeat}, {"max_position_embeddings", 50}};
      if (!sc.is_null()) a["scaling"] = sc;
      compare_op("rope", a, {rnd({2, 97, (8 + 4) * 128}, r)}, {}, 1e-5);
    }
}

TEST_CASE("cuda dropout matches cpu: the dropout op and attention's probability dropout (the same masks)", "[cuda]") {
  Rng r(37);
  const DropoutCtx ctx{true, 1234, 3, 6};
  double worst = compare_op("dropout", {{"dropout", 0.1}, {"site", 2}}, {rnd({3, 45, 77}, r)}, {}, 2e-5, DType::F32, &ctx);
  REQUIRE(worst < 2e-5);
  // Multi-head and grouped-query heads, a window, odd T; the mask differs from no mask (checked on the CPU side).
  compare_op("attention", {{"n_head", 4}, {"dropout", 0.2}, {"site", 1}}, {rnd({2, 37, 3 * 4 * 16}, r)}, {}, 2e-5,
             DType::F32, &ctx);
  compare_op("attention", {{"n_head", 8}, {"n_kv_head", 2}, {"window", 9}, {"dropout", 0.1}, {"site", 0}},
             {rnd({2, 45, 12 * 64}, r)}, {}, 2e-5, DType::F32, &ctx);
}

TEST_CASE("16-bit matmul inputs: exact on 16-bit operands, rounding on others", "[cuda]") {
  for (DType dt : {DType::BF16, DType::F16}) {
    INFO("matmul dtype " << dtype_name(dt));
    MatmulDtype mode(dt);
    Rng r(11);
    Tensor x = rnd({4, 33, 96}, r), w = rnd({80, 96}, r), bias = rnd({80}, r);
    compare_op("linear", {}, {x}, {{"weight", w}, {"bias", bias}}, 2e-5, dt);
    // Bias-gradient sums: several column blocks and 19 row chunks (264 columns), and the 4-byte path (81).
    compare_op("linear", {}, {rnd({4, 300, 96}, r)}, {{"weight", rnd({264, 96}, r)}, {"bias", rnd({264}, r)}}, 2e-5,
               dt);
    compare_op("linear", {}, {rnd({2, 70, 32}, r)}, {{"weight", rnd({81, 32}, r)}, {"bias", rnd({81}, r)}}, 2e-5, dt);
    compare_op("matmul", {}, {rnd({3, 17, 24}, r), rnd({3, 24, 19}, r)}, {}, 2e-5, dt);
    compare_op("matmul", {}, {rnd({3, 17, 24}, r), rnd({24, 19}, r)}, {}, 2e-5, dt);
    // Unrounded operands: the product is visibly 16-bit (so the mode is on), within 16-bit error.
    double d = compare_op("linear", {}, {x}, {{"weight", w}, {"bias", bias}}, 3e-2);
    REQUIRE(d > 1e-5);
    // Head size 64 takes the tensor-core flash kernels: 16-bit operands, fp32 softmax and accumulation.
    compare_op("attention", {{"n_head", 2}}, {rnd({2, 97, 3 * 128}, r)}, {}, 3e-2);
    compare_op("attention", {{"n_head", 3}}, {rnd({1, 200, 3 * 192}, r, 2.0)}, {}, 3e-2);
    compare_op("attention", {{"n_head", 2}}, {rnd({2, 257, 3 * 128}, r, 3.0)}, {}, 3e-2);  // 5 tiles, padded
    REQUIRE(compare_op("attention", {{"n_head", 1}}, {rnd({2, 64, 3 * 64}, r)}, {}, 3e-2) > 1e-6);
  }
}

TEST_CASE("cuda optimizer and reduction kernels match cpu", "[cuda]") {
  Rng r(2);
  auto& cpu = kernels::cpu_backend();
  auto& gpu = kernels::backend(kGpu);
  const int64_t n = 100003;
  Tensor p = rnd({n}, r), g = rnd({n}, r), m = rnd({n}, r, 0.1), v = rnd({n}, r, 0.1);
  for (int64_t i = 0; i < n; ++i) v.f32()[i] = std::fabs(v.f32()[i]);
  for (bool adamw : {true, false}) {
    Tensor pc = p.clone(), mc = m.clone(), vc = v.clone();
    Tensor pg = p.to(kGpu), gg = g.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu);
    cpu.adam_step(pc.f32(), g.f32(), mc.f32(), vc.f32(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, adamw, true, 7);
    gpu.adam_step(pg.f32(), gg.f32(), mg.f32(), vg.f32(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, adamw, true, 7);
    close(pc, pg, 1e-6, "adam params");
    close(mc, mg, 1e-6, "adam m");
    close(vc, vg, 1e-6, "adam v");
  }
  Tensor pc = p.clone(), bc = m.clone(), pg = p.to(kGpu), bg = m.to(kGpu), gg = g.to(kGpu);
  cpu.sgd_step(pc.f32(), g.f32(), bc.f32(), n, 0.1f, 0.9f, 0.1f, 0.01f, true, false);
  gpu.sgd_step(pg.f32(), gg.f32(), bg.f32(), n, 0.1f, 0.9f, 0.1f, 0.01f, true, false);
  close(pc, pg, 1e-6, "sgd");
  REQUIRE(gpu.sum_squares(gg.f32(), n) == Approx(cpu.sum_squares(g.f32(), n)).epsilon(1e-5));
  REQUIRE(gpu.all_finite(gg.f32(), n));
  gpu.set_scalar(gg.f32() + 777, NAN);
  REQUIRE(!gpu.all_finite(gg.f32(), n));
  gpu.set_scalar(gg.f32() + 777, INFINITY);
  REQUIRE(!gpu.all_finite(gg.f32(), n));
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor src = rnd({n}, r, 100.0), dc = Tensor::empty({n}, DType::F32),
           dg = Tensor::empty({n}, DType::F32, MemCategory::Buffers, kGpu);
    Tensor sg = src.to(kGpu);
    cpu.round_to(dt, src.f32(), dc.f32(), n);
    gpu.round_to(dt, sg.f32(), dg.f32(), n);
    close(dc, dg, 0.0, std::string("round to ") + dtype_name(dt));  // bitwise
  }
  Tensor a = rnd({n}, r), x = rnd({n}, r), ag = a.to(kGpu), xg = x.to(kGpu);
  cpu.accumulate(a.f32(), x.f32(), n);
  gpu.accumulate(ag.f32(), xg.f32(), n);
  cpu.scale_inplace(a.f32(), 0.5f, n);
  gpu.scale_inplace(ag.f32(), 0.5f, n);
  close(a, ag, 0.0, "accumulate + scale");
  Tensor bad = ids({10}, 5, r);
  bad.i32()[3] = 9;
  REQUIRE(!gpu.ids_in_range(bad.to(kGpu).i32(), 10, 5));
  REQUIRE(gpu.ids_in_range(bad.to(kGpu).i32(), 10, 10));
  // Deferred: queued without a wait, raised with its message at the next value read (the first failure wins),
  // then forgotten.
  Tensor badg = bad.to(kGpu), one = Tensor::zeros({1}, DType::F32, MemCategory::Buffers, kGpu);
  gpu.check_ids_deferred(badg.i32(), 10, 10, "fine");
  REQUIRE(gpu.get_scalar(one.f32()) == 0.f);
  gpu.check_ids_deferred(badg.i32(), 10, 10, "first");
  gpu.check_ids_deferred(badg.i32(), 10, 5, "a token id is bad");
  gpu.check_ids_deferred(badg.i32(), 10, 6, "later");
  REQUIRE_THROWS_WITH(gpu.get_scalar(one.f32()), Catch::Contains("a token id is bad"));
  REQUIRE(gpu.get_scalar(one.f32()) == 0.f);
  gpu.set_scalar(one.f32(), 2.5f);  // queued: a kernel, not a copy
  REQUIRE(gpu.get_scalar(one.f32()) == 2.5f);
}

TEST_CASE(
    "AdamW with its rounded copies (the engine's update) and the grad check on the GPU match the CPU: vector "
    "and scalar paths, compact f32 copies by slot",
    "[cuda]") {
  Rng r(4);
  auto& cpu = kernels::cpu_backend();
  auto& gpu = kernels::backend(kGpu);
  const int64_t n = 100003;  // n % 4 == 3: a scalar tail after the four-a-thread part
  Tensor p = rnd({n + 1}, r), g = rnd({n + 1}, r), m = rnd({n + 1}, r, 0.1), v = rnd({n + 1}, r, 0.1);
  for (int64_t i = 0; i <= n; ++i) v.f32()[i] = std::fabs(v.f32()[i]);
  // (offset, base): aligned with base % 4 == 0 (vector path), misaligned pointers, base % 4 != 0 (scalar path).
  for (auto [off, base] : {std::pair<int64_t, int64_t>{0, 4}, {1, 4}, {0, 2}})
    for (DType dt : {DType::BF16, DType::F16}) {
      INFO("offset " << off << ", base " << base << ", " << dtype_name(dt));
      // Compact f32 copies: every third chunk has none, the others in order in a buffer of only them.
      const int64_t chunks = (base + n) / 256 + 1;
      Tensor keep = Tensor::empty({chunks}, DType::I32, MemCategory::Buffers);
      int32_t kept = 0;
      for (int64_t k = 0; k < chunks; ++k) keep.i32()[k] = k % 3 != 1 ? kept++ : -1;
      Tensor pc = p.clone(), mc = m.clone(), vc = v.clone();
      cpu.adam_step(pc.f32() + off, g.f32() + off, mc.f32() + off, vc.f32() + off, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                    true, true, 3);
      Tensor pg = p.to(kGpu), gg = g.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu), kg = keep.to(kGpu);
      Tensor sentinel = Tensor::empty({int64_t{kept} * 256}, DType::F32, MemCategory::Buffers);
      std::fill_n(sentinel.f32(), sentinel.numel(), 7.f);
      Tensor r32 = sentinel.to(kGpu), r16 = Tensor::empty({n + 1}, dt, MemCategory::Buffers, kGpu);
      gpu.adam_step_rounded(pg.f32() + off, gg.f32() + off, mg.f32() + off, vg.f32() + off, n, 1e-3f, 0.9f, 0.95f,
                            1e-8f, 0.1f, true, true, 3, dt, r32.f32(), static_cast<uint16_t*>(r16.raw()) + off,
                            kg.i32(), base);
      close(pc, pg, 1e-6, "adam params");
      close(mc, mg, 1e-6, "adam m");
      close(vc, vg, 1e-6, "adam v");
      Tensor h32 = r32.to(Device::cpu()), h16 = r16.to(Device::cpu());
      const uint16_t* bits = static_cast<const uint16_t*>(h16.raw());
      int64_t bad32 = 0, bad16 = 0, written = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = round_to(dt, pc.f32()[off + i]),
                    got16 = dt == DType::BF16 ? bf16_to_f32(bits[off + i]) : f16_to_f32(bits[off + i]);
        const float tol = 1e-2f * std::fabs(want) + 1e-6f;  // the f32 master may differ by an ulp: one 16-bit step
        bad16 += std::fabs(got16 - want) > tol;
        const int32_t k = keep.i32()[(base + i) >> 8];
        if (k >= 0) bad32 += std::fabs(h32.f32()[256 * k + (base + i) % 256] - want) > tol;
      }
      for (int64_t j = 0; j < h32.numel(); ++j) written += h32.f32()[j] != 7.f;
      CHECK(bad16 == 0);
      CHECK(bad32 == 0);
      int64_t want_written = 0;  // kept chunks' elements inside [base, base + n)
      for (int64_t k = 0; k < chunks; ++k)
        if (keep.i32()[k] >= 0)
          want_written += std::max<int64_t>(0, std::min(256 * k + 256, base + n) - std::max(256 * k, base));
      CHECK(written == want_written);  // nothing outside the range, nothing for dropped chunks
    }
  // widen16_slots (stages 1-2 on several GPUs: the compact f32 copy from the all-gathered 16-bit copy) = the CPU's,
  // bit for bit, and nothing written for chunks without a slot.
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t total = n;
    const int64_t chunks = (total + 255) / 256;
    Tensor keep = Tensor::empty({chunks}, DType::I32, MemCategory::Buffers);
    int32_t kept = 0;
    for (int64_t k = 0; k < chunks; ++k) keep.i32()[k] = k % 3 != 1 ? kept++ : -1;
    Tensor h16 = Tensor::empty({total}, dt, MemCategory::Buffers);
    cpu.round_to16(dt, p.f32(), static_cast<uint16_t*>(h16.raw()), nullptr, total);
    Tensor want = Tensor::empty({int64_t{kept} * 256}, DType::F32, MemCategory::Buffers);
    std::fill_n(want.f32(), want.numel(), 7.f);
    Tensor got = want.to(kGpu), hg = h16.to(kGpu), kg = keep.to(kGpu);
    cpu.widen16_slots(dt, static_cast<const uint16_t*>(h16.raw()), want.f32(), total, keep.i32());
    gpu.widen16_slots(dt, static_cast<const uint16_t*>(hg.raw()), got.f32(), total, kg.i32());
    Tensor back = got.to(Device::cpu());
    REQUIRE(std::memcmp(back.raw(), want.raw(), want.nbytes()) == 0);
  }
  // One pass: the sum of squares (f64) and the inf/nan flag, over a length with a tail and two loads a thread.
  for (int64_t len : {int64_t{1}, int64_t{7}, n, int64_t{3} << 20}) {
    Tensor x = rnd({len}, r), xg = x.to(kGpu);
    bool fin = false;
    REQUIRE(gpu.finite_sum_squares(xg.f32(), len, &fin) == Approx(cpu.sum_squares(x.f32(), len)).epsilon(1e-9));
    REQUIRE(fin);
    gpu.set_scalar(xg.f32() + len - 1, NAN);
    gpu.finite_sum_squares(xg.f32(), len, &fin);
    REQUIRE(!fin);
  }
}

TEST_CASE("device memory accounting and the caching allocator", "[cuda]") {
  MemStats before = mem_stats(true);
  {
    Tensor t = Tensor::zeros({1 << 20}, DType::F32, MemCategory::Params, kGpu);
    MemStats mid = mem_stats(true);
    REQUIRE(mid.current[static_cast<size_t>(MemCategory::Params)] -
                before.current[static_cast<size_t>(MemCategory::Params)] ==
            4 << 20);
    REQUIRE(t.to(Device::cpu()).f32()[12345] == 0.f);
  }
  REQUIRE(mem_stats(true).current == before.current);
  REQUIRE(cuda::cached_bytes() >= (4u << 20));  // kept for reuse
}

TEST_CASE("pinned host tensors: page-locked, copied both ways, unpinned when freed; device tensors refuse", "[cuda]") {
  Tensor h = Tensor::empty({3 << 18}, DType::F32, MemCategory::Buffers);
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = static_cast<float>(i % 977);
  std::string why;
  REQUIRE(h.pin_memory(&why));
  REQUIRE(h.pinned());
  REQUIRE_FALSE(cuda::is_device_pointer(h.raw()));
  Tensor d = h.to(kGpu), back = d.to(Device::cpu());
  REQUIRE(std::memcmp(back.raw(), h.raw(), h.nbytes()) == 0);
  REQUIRE_FALSE(d.pin_memory(&why));
  REQUIRE(why == "not host memory");
}

TEST_CASE("out of GPU memory: the error names the size, what it was for, what the rank holds, and how to fit",
          "[cuda]") {
  Tensor keep = Tensor::zeros({1 << 20}, DType::F32, MemCategory::Optimizer, kGpu);
  std::string msg;
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 50}, DType::F32, MemCategory::Activations, kGpu);  // 4 PiB
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  REQUIRE(msg.find("out of GPU memory on cuda:") != std::string::npos);
  REQUIRE(msg.find(" for activations") != std::string::npos);
  const size_t at = msg.find("optimizer ");
  REQUIRE(at != std::string::npos);
  REQUIRE(std::stoll(msg.substr(at + 10)) >= 4);  // MiB: the 4 held above, at least
  REQUIRE(msg.find("train_micro_batch_size_per_gpu") != std::string::npos);
  REQUIRE(msg.find("zerorun estimate") != std::string::npos);
  Tensor after = Tensor::zeros({1 << 10}, DType::F32, MemCategory::Buffers, kGpu);  // the device still works
  REQUIRE(after.to(Device::cpu()).f32()[5] == 0.f);
}

TEST_CASE("CUDA graphs: a captured sequence replays on new inputs; its blocks never go to work outside captures",
          "[cuda]") {
  kernels::Backend& be = kernels::backend(kGpu);
  Tensor x = Tensor::zeros({4096}, DType::F32, MemCategory::Buffers, kGpu), y;
  void* inside = nullptr;
  cuda::Graph g;
  g.begin_capture();
  {
    Tensor t = Tensor::empty({4096}, DType::F32, MemCategory::Buffers, kGpu);  // graph pool scratch
    inside = t.raw();
    be.round_to(DType::F32, x.f32(), t.f32(), 4096);
    be.scale_inplace(t.f32(), 3.f, 4096);
    y = Tensor::empty({4096}, DType::F32, MemCategory::Buffers, kGpu);  // the graph's output, kept
    be.round_to(DType::F32, t.f32(), y.f32(), 4096);
  }
  g.end_capture();
  REQUIRE(g.ready());
  // Nothing ran while capturing; same-size blocks asked for now are never the graph's.
  Tensor other = Tensor::empty({4096}, DType::F32, MemCategory::Buffers, kGpu);
  REQUIRE(other.raw() != inside);
  REQUIRE(other.raw() != y.raw());
  for (float v : {1.f, -2.5f}) {
    Tensor h = Tensor::empty({4096}, DType::F32);
    std::fill_n(h.f32(), 4096, v);
    x.copy_from(h);
    g.launch();
    Tensor back = y.to(Device::cpu());
    REQUIRE(back.f32()[0] == 3.f * v);
    REQUIRE(back.f32()[4095] == 3.f * v);
  }
  // A host read inside a capture breaks it with a clear error, and the stream works afterwards.
  cuda::Graph bad;
  bad.begin_capture();
  REQUIRE_THROWS(be.get_scalar(x.f32()));
  bad.abort_capture();
  REQUIRE(be.get_scalar(x.f32()) == -2.5f);
}

// Every test case starts with the GPU backend in fp32 products: a training test's Engine sets the backend's matmul
// dtype to its config's (bf16) and leaves it, and the fp32 attention test that ran after them compared bf16
// tensor-core attention with the CPU's fp32 (2.4e-3 off, the H100 run of 8dee3c7).
struct Fp32EachTest : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const&) override { kernels::backend(kGpu).set_matmul_dtype(DType::F32); }
};
CATCH_REGISTER_LISTENER(Fp32EachTest)

int main(int argc, char** argv) {
  if (!cuda::available()) {
    std::printf("no GPU visible: CUDA op tests skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

TEST_CASE("fused 16-bit cross-entropy (forward and backward in one pass, in place) matches the CPU", "[cuda]") {
  // Rows shorter and longer than the block's 1024 threads x 4, GPT-2's padded vocabulary, V % 8 != 0.
  auto& cpu = kernels::cpu_backend();
  auto& gpu = kernels::backend(kGpu);
  struct Restore {
    kernels::Backend& b;
    ~Restore() { b.set_matmul_dtype(DType::F32); }
  } restore{gpu};
  gpu.set_matmul_dtype(DType::BF16);
  Rng r(8);
  for (auto [N, V] : {std::pair<int64_t, int64_t>{37, 1000}, {37, 1004}, {5, 96}, {3, 50304}}) {
    INFO("N " << N << ", V " << V);
    REQUIRE(gpu.fuses_cross_entropy(V));
    Tensor logits = rounded(rnd({N, V}, r, 4.0), DType::BF16), tg = ids({N}, V, r);
    tg.i32()[0] = 0, tg.i32()[N - 1] = static_cast<int32_t>(V - 1);  // the first and last column of a row
    Tensor lse = Tensor::empty({N}, DType::F32, MemCategory::Buffers),
           loss = Tensor::empty({}, DType::F32, MemCategory::Buffers);
    Tensor dl = Tensor::empty({N, V}, DType::F32, MemCategory::Buffers),
           dloss = Tensor::empty({}, DType::F32, MemCategory::Buffers);
    dloss.f32()[0] = 0.5f;
    cpu.cross_entropy_fwd(logits.f32(), tg.i32(), lse.f32(), N, V, loss.f32());
    cpu.cross_entropy_bwd(logits.f32(), tg.i32(), lse.f32(), dloss.f32(), kernels::Grad(dl.f32(), false), N, V);
    Tensor l16 = to16(logits, DType::BF16).to(kGpu), tgg = tg.to(kGpu), dlg = dloss.to(kGpu);
    Tensor lossg = Tensor::empty({}, DType::F32, MemCategory::Buffers, kGpu);
    gpu.cross_entropy_fused16(static_cast<uint16_t*>(l16.raw()), tgg.i32(), N, V, dlg.f32(), lossg.f32());
    REQUIRE(gpu.get_scalar(lossg.f32()) == Approx(loss.f32()[0]).epsilon(1e-5));
    Tensor back = l16.to(Device::cpu()), d = Tensor::empty({N, V}, DType::F32, MemCategory::Buffers);
    for (int64_t i = 0; i < N * V; ++i) d.f32()[i] = bf16_to_f32(static_cast<const uint16_t*>(back.raw())[i]);
    close(dl, d, 1e-2, "d(logits) in place, bf16");  // of the largest entry: one bf16 rounding
  }
}
