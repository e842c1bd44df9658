// Packed documents: a row holding several documents, with the "positions" input restarting at each document, must
// compute for each document what the document computes alone (rope and learned positions from 0, no attention
// across documents) — the loss of each document and the parameter gradients of the whole row.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "zerorun/graph.h"
#include "zerorun/model.h"

using namespace zerorun;

namespace {

struct Pass {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// Forward + backward of one batch; the loss and every parameter gradient.
Pass run(const Model& m, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt,
         const std::vector<int32_t>* pos, int64_t B, int64_t T) {
  std::map<std::string, Tensor> grads;
  for (auto& [n, t] : m.tensors) grads[n] = Tensor::zeros(t.shape(), DType::F32);
  Executor ex(m.graph, m.tensors, grads);
  auto i32 = [&](const std::vector<int32_t>& v) {
    Tensor t = Tensor::empty({B, T}, DType::I32);
    std::copy(v.begin(), v.end(), t.i32());
    return t;
  };
  std::map<std::string, Tensor> in{{"tokens", i32(tok)}, {"targets", i32(tgt)}};
  if (pos) in["positions"] = i32(*pos);
  Pass p;
  p.loss = ex.forward(in);
  ex.backward(1.f);
  for (auto& [n, g] : grads) p.grads[n].assign(g.f32(), g.f32() + g.numel());
  return p;
}

// Documents of these lengths (tokens; each predicts its own next tokens only) packed into one row of T.
void check_packing(const Model& m, int64_t V) {
  const std::vector<int64_t> lens = {5, 7, 4};
  int64_t T = 0;
  for (int64_t l : lens) T += l;
  std::vector<int32_t> tok(static_cast<size_t>(T)), pos(tok.size()), doc(tok.size());
  for (int64_t t = 0; t < T; ++t) tok[static_cast<size_t>(t)] = static_cast<int32_t>((7 * t + 3) % V);
  for (int64_t d = 0, t = 0; d < static_cast<int64_t>(lens.size()); ++d)
    for (int64_t i = 0; i < lens[static_cast<size_t>(d)]; ++i, ++t) {
      pos[static_cast<size_t>(t)] = static_cast<int32_t>(i);
      doc[static_cast<size_t>(t)] = static_cast<int32_t>(d);
    }
  // Targets: the next token of the same document (a document's last token predicts nothing).
  auto targets_of = [&](int64_t only) {
    std::vector<int32_t> y(tok.size(), -100);
    for (int64_t t = 0; t + 1 < T; ++t)
      if (doc[static_cast<size_t>(t)] == doc[static_cast<size_t>(t + 1)] &&
          (only < 0 || doc[static_cast<size_t>(t)] == only))
        y[static_cast<size_t>(t)] = tok[static_cast<size_t>(t + 1)];
    return y;
  };
  // Each document alone: its loss, and the packed row's gradient as the sum of theirs. The cross-entropy is the sum
  // over counted targets divided by the rows (the engine rescales by the counted targets): compare sums.
  std::map<std::string, std::vector<double>> want;
  double worst = 0, worst_g = 0, gmax = 0;
  for (int64_t d = 0, start = 0; d < static_cast<int64_t>(lens.size()); start += lens[static_cast<size_t>(d)], ++d) {
    const int64_t L = lens[static_cast<size_t>(d)];
    std::vector<int32_t> t1(tok.begin() + start, tok.begin() + start + L), y1(static_cast<size_t>(L), -100);
    for (int64_t i = 0; i + 1 < L; ++i) y1[static_cast<size_t>(i)] = t1[static_cast<size_t>(i + 1)];
    const Pass alone = run(m, t1, y1, nullptr, 1, L);
    const Pass packed = run(m, tok, targets_of(d), &pos, 1, T);
    const double sum_packed = packed.loss * static_cast<double>(T), sum_alone = alone.loss * static_cast<double>(L);
    worst = std::max(worst, std::fabs(sum_packed - sum_alone) / std::fabs(sum_alone));
    for (auto& [n, g] : alone.grads) {
      auto& w = want[n];
      w.resize(g.size());
      for (size_t i = 0; i < g.size(); ++i) w[i] += g[i] * static_cast<double>(L) / static_cast<double>(T);
    }
  }
  const Pass all = run(m, tok, targets_of(-1), &pos, 1, T);
  for (auto& [n, g] : all.grads)
    for (size_t i = 0; i < g.size(); ++i) {
      worst_g = std::max(worst_g, std::fabs(g[i] - want[n][i]));
      gmax = std::max(gmax, std::fabs(want[n][i]));
    }
  INFO("worst relative loss difference " << worst << ", gradient difference " << worst_g << " of max " << gmax);
  CHECK(worst < 2e-6);
  CHECK(worst_g < 1e-5 * gmax);
  // Without positions the documents see each other and rope / the position table count on: not the same.
  const Pass crossing = run(m, tok, targets_of(2), nullptr, 1, T);
  const Pass alone2 = [&] {
    std::vector<int32_t> t1(tok.end() - lens[2], tok.end()), y1(static_cast<size_t>(lens[2]), -100);
    for (int64_t i = 0; i + 1 < lens[2]; ++i) y1[static_cast<size_t>(i)] = t1[static_cast<size_t>(i + 1)];
    return run(m, t1, y1, nullptr, 1, lens[2]);
  }();
  const double crossing_sum = crossing.loss * static_cast<double>(T),
               alone_sum = alone2.loss * static_cast<double>(lens[2]);
  CHECK(std::fabs(crossing_sum - alone_sum) > 1e-3 * std::fabs(alone_sum));
}

}  // namespace

TEST_CASE("packed documents: GPT-2 (learned positions) computes each document as it does alone", "[packing]") {
  Gpt2Spec s;
  s.vocab = 40;
  s.n_ctx = 16;
  s.n_embd = 32;
  s.n_layer = 2;
  s.n_head = 4;
  check_packing(build_gpt2(s, 3), s.vocab);
}

TEST_CASE("packed documents: Llama-family features (rope, GQA, window, softcap, q/k norm) per document", "[packing]") {
  LlamaSpec s;
  s.vocab = 40;
  s.n_ctx = 16;
  s.n_embd = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.ffn = 48;
  SECTION("llama3 rope scaling, grouped-query heads") {
    s.rope_scaling = {{"rope_type", "llama3"},
                      {"factor", 8.0},
                      {"low_freq_factor", 1.0},
                      {"high_freq_factor", 4.0},
                      {"original_max_position_embeddings", 8}};
    check_packing(build_llama(s, 5), s.vocab);
  }
  SECTION("Gemma 2-like: sandwich norms, soft-capping, a window of 3 on alternate layers, per-head q/k norm") {
    s.norm_place = "sandwich";
    s.norm_offset = 1.0;
    s.act = "gelu_tanh";
    s.embed_scale = std::sqrt(32.0);
    s.attn_softcap = 50.0;
    s.final_softcap = 30.0;
    s.window = 3;
    s.sliding = {true, false};
    s.qk_norm = "head";
    check_packing(build_llama(s, 7), s.vocab);
  }
}
