// Activation memory (issue 31): the chunked head and loss (Executor::loss_chunk_rows / loss_chunk_bytes) and
// selective recomputation (Executor::set_recompute, checkpoint_block) give the losses and gradients of the plain
// executor -- tied and untied heads, Gemma 2's final soft-cap, ignored (-100) targets, gradient accumulation into
// fresh gradients -- and lower the activations' peak counter, which each case prints.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iostream>

#include "zerorun/graph.h"
#include "zerorun/memory.h"
#include "zerorun/model.h"

using namespace zerorun;
using Tensors = std::map<std::string, Tensor>;

namespace {
struct Run {
  double loss = 0;
  Tensors grads;
  int64_t peak = 0;  // activations' peak bytes over the forward and backward
  int64_t chunks = 0;
};

Tensors inputs(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor tok = Tensor::empty({B, T}, DType::I32), tgt = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    tok.i32()[i] = static_cast<int32_t>((i * 7 + seed) % V);
    tgt.i32()[i] = i % 5 == 3 ? -100 : static_cast<int32_t>((i * 13 + 3 * seed + 1) % V);  // some ignored
  }
  return {{"tokens", tok}, {"targets", tgt}};
}

// `passes` forward/backward passes into fresh gradients (the first overwrites, later ones accumulate), with
// `setup` configuring the executor.
Run run(const Model& m, const std::vector<Tensors>& batches, const std::function<void(Executor&)>& setup) {
  Run r;
  for (auto& [k, t] : m.tensors) {
    r.grads[k] = Tensor::empty(t.shape(), DType::F32);
    std::fill_n(r.grads[k].f32(), t.numel(), std::nanf(""));  // stale: never read
  }
  Executor ex(m.graph, m.tensors, r.grads);
  setup(ex);
  ex.mark_grads_fresh();
  mem_reset_peaks();
  const int64_t base = mem_stats().current[static_cast<size_t>(MemCategory::Activations)];
  for (auto& in : batches) {
    r.loss += ex.forward(in);
    r.chunks = ex.last_loss_chunks();
    ex.backward(1.f);
  }
  r.peak = mem_stats().peak[static_cast<size_t>(MemCategory::Activations)] - base;
  return r;
}

void same(const Run& a, const Run& b, bool bitwise) {
  if (bitwise)
    REQUIRE(a.loss == b.loss);
  else
    REQUIRE(std::fabs(a.loss - b.loss) <= 1e-6 * std::fabs(a.loss));
  for (auto& [k, t] : a.grads) {
    INFO(k);
    const Tensor& u = b.grads.at(k);
    if (bitwise) {
      REQUIRE(std::memcmp(t.raw(), u.raw(), t.nbytes()) == 0);
      continue;
    }
    double mx = 0, diff = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      REQUIRE(std::isfinite(u.f32()[i]));
      mx = std::max(mx, std::fabs(static_cast<double>(t.f32()[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(t.f32()[i]) - u.f32()[i]));
    }
    REQUIRE(diff <= 2e-6 * mx + 1e-9);  // float rounding of sums taken in another order
  }
}

LlamaSpec small_llama(int64_t V, bool tied, double final_softcap) {
  LlamaSpec s;
  s.vocab = V;
  s.n_ctx = 32;
  s.n_embd = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.ffn = 48;
  s.tied = tied;
  s.final_softcap = final_softcap;
  return s;
}
}  // namespace

TEST_CASE("chunked head and loss: the unchunked loss and gradients, a chunk's logits at a time", "[memory]") {
  struct Case {
    const char* name;
    Model m;
    int64_t V;
  };
  Gpt2Spec gs;
  gs.vocab = 97;
  gs.n_ctx = 16;
  gs.n_embd = 32;
  gs.n_layer = 1;
  gs.n_head = 2;
  std::vector<Case> cases;
  cases.push_back({"llama tied", build_llama(small_llama(512, true, 0.0), 1), 512});
  cases.push_back({"llama untied, final soft-cap", build_llama(small_llama(512, false, 5.0), 2), 512});
  cases.push_back({"gpt2 tied, odd vocabulary", build_gpt2(gs, 3), 97});
  for (auto& c : cases) {
    INFO(c.name);
    const int64_t V = c.V;
    const std::vector<Tensors> batches = {inputs(2, 16, V, 1), inputs(2, 16, V, 2)};  // 2 micro-batches
    const Run plain = run(c.m, batches, [](Executor& ex) {
      ex.loss_chunk_bytes = 0;
      REQUIRE(ex.loss_chunk_planned());
    });
    CHECK(plain.chunks == 0);
    for (int64_t rows : {5, 8, 31}) {
      INFO(rows << " rows a chunk");
      const Run ch = run(c.m, batches, [&](Executor& ex) { ex.loss_chunk_rows = rows; });
      CHECK(ch.chunks == (32 + rows - 1) / rows);
      same(plain, ch, false);
      std::cout << "[memory] " << c.name << ": activations peak " << plain.peak << " B unchunked, " << ch.peak
                << " B in chunks of " << rows << " rows\n";
      if (rows == 5 && V > 100) CHECK(ch.peak < plain.peak);  // (GPT-2's 97 logits a row set no peak)
    }
    // The automatic size: chunks of loss_chunk_bytes of logits (f32 here: 4 bytes a logit), at least 8 rows.
    const Run autosz = run(c.m, batches, [&](Executor& ex) { ex.loss_chunk_bytes = 8 * V * 4; });
    CHECK(autosz.chunks == 4);
    same(plain, autosz, false);
    // The engine's automatic default leaves heads below loss_chunk_min_vocab outputs whole.
    const Run whole = run(c.m, batches, [&](Executor& ex) {
      ex.loss_chunk_bytes = 8 * V * 4;
      ex.loss_chunk_min_vocab = V + 1;
    });
    CHECK(whole.chunks == 0);
  }
}

TEST_CASE("chunked head and loss: a Qwen2.5-0.5B-like head (vocabulary 151936, hidden 896)", "[memory]") {
  LlamaSpec s = small_llama(151936, true, 0.0);
  s.n_embd = 896;
  s.n_head = 14;
  s.n_kv_head = 2;
  s.ffn = 4864 / 8;  // reduced (the head and loss are what is measured)
  s.n_layer = 1;
  s.n_ctx = 32;
  s.qkv_bias = true;
  const Model m = build_llama(s, 4);
  const std::vector<Tensors> batches = {inputs(2, 32, s.vocab, 5)};
  const Run plain = run(m, batches, [](Executor& ex) { ex.loss_chunk_bytes = 0; });
  const Run ch = run(m, batches, [](Executor& ex) { ex.loss_chunk_rows = 16; });
  CHECK(ch.chunks == 4);
  same(plain, ch, false);
  const double mib = 1024.0 * 1024.0;
  std::cout << "[memory] Qwen2.5-0.5B-like head, B=2 T=32 (64 rows): activations peak " << plain.peak / mib
            << " MiB unchunked, " << ch.peak / mib << " MiB in chunks of 16 rows\n";
  // The logits and their gradient ([64, 151936] f32 each) dominate the unchunked peak; chunked, 16 rows of each.
  const int64_t logits = 64 * s.vocab * 4;
  CHECK(plain.peak >= 2 * logits);
  CHECK(ch.peak < plain.peak - logits);
}

TEST_CASE("selective recomputation: each mode gives the same loss and gradients and a lower activations peak",
          "[memory]") {
  LlamaSpec s = small_llama(256, true, 0.0);
  s.n_layer = 4;
  s.qk_norm = "head";  // Qwen3's per-head q/k norms: recomputed with the norms
  s.n_embd = 64;
  s.ffn = 160;
  const Model m = build_llama(s, 6);
  const std::vector<Tensors> batches = {inputs(2, 32, s.vocab, 7), inputs(2, 32, s.vocab, 8)};
  const size_t nb = m.graph.blocks.size();
  std::vector<bool> inner(nb);
  for (size_t b = 0; b < nb; ++b) inner[b] = b != 0 && b + 1 != nb;  // as the engine: not embedding nor head
  auto mode = [&](const std::set<std::string>& classes, bool block, int expect_nodes) {
    return run(m, batches, [&](Executor& ex) {
      ex.loss_chunk_rows = 16;  // the logits out of the way: the blocks' activations set the peak
      if (block) ex.checkpoint_block = inner;
      CHECK(ex.set_recompute(classes, inner) == expect_nodes);
    });
  };
  const Run none = mode({}, false, 0);
  const int64_t L = s.n_layer;
  const Run norms = mode({"norms"}, false, 3 * static_cast<int>(L));  // 2 RMSNorms + q/k norm a layer
  const Run act = mode({"mlp_act"}, false, static_cast<int>(L));
  const Run attn = mode({"attention"}, false, static_cast<int>(L));
  const Run all3 = mode({"norms", "mlp_act", "attention"}, false, 5 * static_cast<int>(L));
  const Run block = mode({}, true, 0);
  std::cout << "[memory] recompute peaks (llama 4 layers, C 64, ffn 160, B 2 T 32, 2 micro-batches): none " << none.peak
            << " B, norms " << norms.peak << " B, mlp_act " << act.peak << " B, attention " << attn.peak
            << " B, norms+mlp_act+attention " << all3.peak << " B, block " << block.peak << " B\n";
  for (const Run* r : {&norms, &act, &attn, &all3, &block}) {
    same(none, *r, true);  // the same ops on the same inputs: bitwise
    CHECK(r->peak < none.peak);
  }
  CHECK(all3.peak < norms.peak);
  CHECK(all3.peak < act.peak);
  CHECK(all3.peak < attn.peak);
  CHECK(block.peak <= all3.peak);
}
