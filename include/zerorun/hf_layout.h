// How a zerorun model's parameters map onto transformers' checkpoint layout
// (GPT2LMHeadModel, LlamaForCausalLM), shared by `zerorun merge` (writing it)
// and `zerorun import` (reading it) so the two stay inverse.
#pragma once
#include <string>
#include <vector>

#include "zerorun/graph.h"

namespace zerorun {

// Rows [row0, row0 + rows) of a zerorun [out, in] (or 1-D) parameter as rows [hf_row0, hf_row0 + rows) of the
// transformers tensor `name` (the whole tensor unless it is fused from several parameters, as Phi-3's
// gate_up_proj), stored transposed ([in, out], GPT-2's Conv1D) where `transpose`.
struct HfPiece {
  std::string name;
  Shape shape;  // the whole transformers tensor, as transformers stores it
  int64_t row0 = 0, rows = 0;
  bool transpose = false;
  int64_t hf_row0 = 0;
};

// The transformers class a graph is saved as in its layout ("GPT2LMHeadModel", "LlamaForCausalLM",
// "Qwen2ForCausalLM", ... by the graph's model_type), or "" where there is none (mlp; a llama with a learned
// position table, from before rotary embeddings).
std::string hf_class(const Graph& g);
// The pieces of one parameter of a graph whose hf_class is not "": GPT-2's "transformer." prefix and Conv1D
// transposes; the decoders' "model." prefix and self_attn.qkv_proj (weight and bias) split into q_proj, k_proj,
// v_proj, except Phi-3's, which keeps qkv_proj and fuses mlp.gate_proj and mlp.up_proj into mlp.gate_up_proj.
std::vector<HfPiece> hf_pieces(const Graph& g, const std::string& name, const Shape& shape);
// transformers' config.json for the graph (hf_class not ""): the imported config.json where the graph keeps one
// (every field as it was), else one built from its arch_config.
json hf_config_json(const Graph& g);

// Whether a zerorun gpt2 parameter is one of transformers' Conv1D weights, stored [in, out] there.
bool hf_gpt2_conv1d(const std::string& name);
// Copies `p`'s part of a zerorun parameter `src` ([out, in] row-major, `cols` = in, 1 for 1-D) into `dst` in
// transformers' layout, or back (to_hf false: dst is the zerorun parameter, src the piece).
void hf_copy_piece(const HfPiece& p, int64_t cols, const float* src, float* dst, bool to_hf);

}  // namespace zerorun
