// Shared by the unit, MPI and CUDA tests: the tiny GPT-2 they train and a
// config parsed and resolved from inline JSON.
#pragma once
#include <string>

#include "zerorun/config.h"
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

}  // namespace zerorun::testing
