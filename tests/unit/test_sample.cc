// zerorun sample's decoder: one token at a time over the key/value cache gives the logits of the whole sequence run
// at once (the prompt's prefill) and the training forward's loss; the token pickers follow transformers' warpers.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <vector>

#include "zerorun/graph.h"
#include "zerorun/model.h"
#include "zerorun/sample.h"

using namespace zerorun;

namespace {

// Every step's logits decoding one token at a time, against the whole sequence fed at once and against the training
// graph's cross-entropy of the sequence (the executor: no cache, the ops as they train).
void check_decoder(const Model& m, int64_t V, int64_t L) {
  std::vector<int32_t> seq(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) seq[static_cast<size_t>(t)] = static_cast<int32_t>((11 * t + 5) % V);
  Decoder one(m, Device::cpu(), L), all(m, Device::cpu(), L);
  std::vector<float> steps;
  for (int32_t id : seq) {
    const std::vector<float> lg = one.feed({id});
    steps.insert(steps.end(), lg.begin(), lg.end());
  }
  CHECK(one.length() == L);
  // Prefill of 5, then the rest one by one: the same again.
  std::vector<float> mixed = all.feed(std::vector<int32_t>(seq.begin(), seq.begin() + 5), true);
  for (int64_t t = 5; t < L; ++t) {
    const std::vector<float> lg = all.feed({seq[static_cast<size_t>(t)]});
    mixed.insert(mixed.end(), lg.begin(), lg.end());
  }
  all.reset();
  const std::vector<float> at_once = all.feed(seq, true);
  REQUIRE(at_once.size() == steps.size());
  double worst = 0, worst_mixed = 0, scale = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(steps[i] - at_once[i])));
    worst_mixed = std::max(worst_mixed, static_cast<double>(std::fabs(mixed[i] - at_once[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(at_once[i])));
  }
  INFO("cache vs at once: " << worst << ", prefill + cache: " << worst_mixed << ", logits up to " << scale);
  CHECK(worst < 1e-5 * scale);
  CHECK(worst_mixed < 1e-5 * scale);
  // The training forward's mean cross-entropy of seq (targets: the next tokens) from the decoder's logits.
  double ce = 0;
  for (int64_t t = 0; t + 1 < L; ++t) {
    const float* z = steps.data() + t * V;
    double mx = z[0], s = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    ce += mx + std::log(s) - z[seq[static_cast<size_t>(t + 1)]];
  }
  std::map<std::string, Tensor> grads;
  Executor ex(m.graph, m.tensors, grads);
  Tensor tok = Tensor::empty({1, L - 1}, DType::I32), tgt = Tensor::empty({1, L - 1}, DType::I32);
  for (int64_t t = 0; t + 1 < L; ++t) {
    tok.i32()[t] = seq[static_cast<size_t>(t)];
    tgt.i32()[t] = seq[static_cast<size_t>(t + 1)];
  }
  const double train = ex.forward({{"tokens", tok}, {"targets", tgt}});
  ce /= static_cast<double>(L - 1);
  INFO("decoder cross-entropy " << ce << ", training forward " << train);
  CHECK(std::fabs(ce - train) < 1e-5 * train);
}

}  // namespace

TEST_CASE("decoder: GPT-2 one token at a time over the cache = all at once = the training forward", "[sample]") {
  Gpt2Spec s;
  s.vocab = 50;
  s.n_ctx = 24;
  s.n_embd = 32;
  s.n_layer = 2;
  s.n_head = 4;
  check_decoder(build_gpt2(s, 3), s.vocab, 20);
}

TEST_CASE("decoder: Llama-family features one token at a time = all at once = the training forward", "[sample]") {
  LlamaSpec s;
  s.vocab = 50;
  s.n_ctx = 24;
  s.n_embd = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.ffn = 48;
  SECTION("yarn rope, grouped-query heads, biases") {
    s.rope_scaling = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 8}};
    s.qkv_bias = true;
    check_decoder(build_llama(s, 5), s.vocab, 20);
  }
  SECTION("Gemma 2/3-like: sandwich norms, soft-capping, window 4 on alternate layers, q/k norm, local rope") {
    s.norm_place = "sandwich";
    s.norm_offset = 1.0;
    s.act = "gelu_tanh";
    s.embed_scale = std::sqrt(32.0);
    s.attn_softcap = 50.0;
    s.final_softcap = 30.0;
    s.window = 4;
    s.sliding = {true, false};
    s.local_rope_theta = 10000.0;
    s.rope_theta = 1e6;
    s.qk_norm = "head";
    check_decoder(build_llama(s, 7), s.vocab, 20);
  }
}

TEST_CASE("pick_token: greedy, top-k, top-p and the draw follow transformers' warpers", "[sample]") {
  const std::vector<float> z = {0.f, 3.f, 1.f, 3.f, 2.f};  // ids 1 and 3 tie for the largest
  Rng rng(1);
  CHECK(pick_token(z.data(), 5, {}, rng) == 1);  // greedy: the first largest
  Sampling topk1{1.0, 1, 1.0};                   // top_k 1 keeps both tied ids (TopK keeps ties)
  for (int i = 0; i < 50; ++i) {
    const int32_t t = pick_token(z.data(), 5, topk1, rng);
    CHECK((t == 1 || t == 3));
  }
  // p = softmax([0, ln 3]) = 1/4, 3/4 over ids 0 and 1; top_p 0.7 keeps id 1 alone, 0.8 both.
  const std::vector<float> two = {0.f, static_cast<float>(std::log(3.0))};
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += pick_token(two.data(), 2, {1.0, 0, 1.0}, rng);
  CHECK(std::abs(ones / 4000.0 - 0.75) < 0.03);
  for (int i = 0; i < 50; ++i) CHECK(pick_token(two.data(), 2, {1.0, 0, 0.7}, rng) == 1);
  int zeros = 0;
  for (int i = 0; i < 2000; ++i) zeros += pick_token(two.data(), 2, {1.0, 0, 0.8}, rng) == 0;
  CHECK(zeros > 300);
  // Temperature 0.5 squares the odds: 1 : 9.
  ones = 0;
  for (int i = 0; i < 4000; ++i) ones += pick_token(two.data(), 2, {0.5, 0, 1.0}, rng);
  CHECK(std::abs(ones / 4000.0 - 0.9) < 0.02);
  // The same seed, the same draws.
  Rng a(7), b(7);
  for (int i = 0; i < 20; ++i)
    CHECK(pick_token(z.data(), 5, {1.0, 0, 1.0}, a) == pick_token(z.data(), 5, {1.0, 0, 1.0}, b));
}
