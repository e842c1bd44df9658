// How a zerorun model's parameters map onto transformers' checkpoint layout
// (GPT2LMHeadModel, LlamaForCausalLM), shared by `zerorun merge` (writing it)
// and `zerorun import` (reading it) so the two stay inverse.
#pragma once
#include <string>
#include <vector>

#include "zerorun/graph.h"

namespace zerorun {

// One transformers tensor holding rows [row0, row0 + rows) of a zerorun [out, in] (or 1-D) parameter, stored
// transposed ([in, out], GPT-2's Conv1D) where `transpose`.
struct HfPiece {
  std::string name;
  Shape shape;  // as transformers stores it
  int64_t row0 = 0, rows = 0;
  bool transpose = false;
};

// The transformers class a graph is saved as in its layout ("GPT2LMHeadModel", "LlamaForCausalLM"), or "" where
// there is none (mlp; a llama with a learned position table, from before rotary embeddings).
std::string hf_class(const Graph& g);
// The pieces of one parameter of a graph whose hf_class is not "": GPT-2's "transformer." prefix and Conv1D
// transposes; Llama's "model." prefix and self_attn.qkv_proj split into q_proj, k_proj, v_proj.
std::vector<HfPiece> hf_pieces(const Graph& g, const std::string& name, const Shape& shape);
// transformers' config.json for the graph (hf_class not ""), from its arch_config.
json hf_config_json(const Graph& g);

// Whether a zerorun gpt2 parameter is one of transformers' Conv1D weights, stored [in, out] there.
bool hf_gpt2_conv1d(const std::string& name);
// Copies `p`'s part of a zerorun parameter `src` ([out, in] row-major, `cols` = in, 1 for 1-D) into `dst` in
// transformers' layout, or back (to_hf false: dst is the zerorun parameter, src the piece).
void hf_copy_piece(const HfPiece& p, int64_t cols, const float* src, float* dst, bool to_hf);

}  // namespace zerorun
