// Shared by the unit, MPI and CUDA tests: the tiny GPT-2 they train and a
// config parsed and resolved from inline JSON.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "zerorun/config.h"
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

}  // namespace zerorun::testing
