// Shared by the unit, MPI and CUDA tests: the tiny GPT-2 they train and a
// config parsed and resolved from inline JSON.
#pragma once
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "zerorun/comm.h"
#include "zerorun/config.h"
#include "zerorun/data.h"
#include "zerorun/engine.h"
#include "zerorun/model.h"

namespace zerorun::testing {

inline Gpt2Spec tiny_gpt_spec(int64_t vocab = 64, int64_t n_embd = 32) {
  Gpt2Spec s;
  s.vocab = vocab;
  s.n_ctx = 16;
  s.n_embd = n_embd;
  s.n_layer = 2;
  s.n_head = 4;
  return s;
}

inline LlamaSpec tiny_llama_spec(int64_t vocab, int64_t n_ctx, int64_t n_embd, int64_t n_layer, int64_t n_head,
                                 int64_t ffn) {
  LlamaSpec s;
  s.vocab = vocab;
  s.n_ctx = n_ctx;
  s.n_embd = n_embd;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.ffn = ffn;
  return s;
}

inline Model tiny_gpt(uint64_t seed = 11, int64_t vocab = 64, int64_t n_embd = 32) {
  return build_gpt2(tiny_gpt_spec(vocab, n_embd), seed);
}

inline Config make_cfg(const std::string& text, int world = 1, int64_t hidden = 32, bool on_gpu = false) {
  Config c = parse_config(json::parse(text), "test");
  ResolveContext rc;
  rc.world_size = world;
  rc.hidden = hidden;
  rc.on_gpu = on_gpu;
  resolve_config(c, rc);
  return c;
}

// Per-step losses of `steps` steps on one rank (synthetic data, seed 5); the
// final fp32 weights into *w when given.
inline std::vector<double> train_losses(const Model& m, const Config& c, int steps,
                                        std::map<std::string, Tensor>* w = nullptr) {
  auto comm = make_self_comm();
  Engine e(m, c, *comm, steps);
  auto data = make_data_source("synthetic", m, e.seq_len(), 5);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(e.train_step(*data).loss);
  if (w) *w = e.master_weights();
  return losses;
}

// Two engines on the same data, one evaluating (2 batches) after every step: what the eval tests compare.
struct EvalRun {
  double eval0 = 0, step1 = 0;           // eval of batch 0 before any step; step 1's training loss
  std::vector<double> with_eval, plain;  // the two engines' step losses
  bool same_weights = false;             // final master weights bitwise equal
};
inline EvalRun eval_between_steps(const Model& g, const Config& c, int steps = 4) {
  auto comm = make_self_comm();
  Engine a(g, c, *comm, steps + 2), b(g, c, *comm, steps + 2);
  auto data = make_data_source("synthetic", g, a.seq_len(), 5);
  EvalRun r;
  r.eval0 = a.eval_loss(*data, 1);
  for (int s = 0; s < steps; ++s) {
    r.with_eval.push_back(a.train_step(*data).loss);
    if (!std::isfinite(a.eval_loss(*data, 2))) r.with_eval.back() = NAN;
    r.plain.push_back(b.train_step(*data).loss);
  }
  r.step1 = r.plain.at(0);
  auto wa = a.master_weights(), wb = b.master_weights();
  r.same_weights = true;
  for (auto& [k, t] : wa) r.same_weights = r.same_weights && std::memcmp(t.raw(), wb.at(k).raw(), t.nbytes()) == 0;
  return r;
}

}  // namespace zerorun::testing
