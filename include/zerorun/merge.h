// `zerorun merge`: ZeRO shards -> full weights (see src/checkpoint/merge.cc).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "zerorun/dtype.h"

namespace zerorun {

struct MergeResult {
  std::string dir, safetensors, model_bin, config_json;
  std::string hf_class;  // model.safetensors is in this transformers class's layout ("": zerorun's)
  bool hf_layout() const { return !hf_class.empty(); }
  int64_t params = 0, largest = 0, peak_rss_bytes = 0, baseline_rss_bytes = 0;  // RSS: peak, and at the start
  std::vector<std::string> tokenizer_files;                                     // copied from the imported directory
  std::vector<std::string> notes;  // what the user should know (files not copied)
};

// How model.safetensors names and lays out the weights. Hf: a gpt2 checkpoint is written as transformers'
// GPT2LMHeadModel saves itself ("transformer."-prefixed names, the Conv1D weights of c_attn, c_proj and c_fc stored
// [in, out], lm_head only when untied), a llama as LlamaForCausalLM does ("model." names, q/k/v_proj split from
// qkv_proj), so from_pretrained(OUT) loads it with config.json (include/zerorun/hf_layout.h); mlp and pre-rotary
// llama models have no transformers equivalent and keep zerorun's layout. Zerorun: the names and torch.nn.Linear
// [out, in] layout of model.bin, for every architecture.
enum class MergeLayout { Hf, Zerorun };

MergeResult merge_checkpoint(const std::string& ckpt, const std::string& tag, const std::string& out_dir, DType dtype,
                             MergeLayout layout = MergeLayout::Hf);

}  // namespace zerorun
