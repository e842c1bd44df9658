// transformers' decoder model_types (llama, mistral, qwen2, qwen3, phi3, olmo2,
// gemma, gemma2, gemma3 / gemma3_text) as LlamaSpec feature sets, read from a
// config.json of transformers 4.x or 5.x (src/model/hf_arch.cc).
#pragma once
#include <string>
#include <vector>

#include "zerorun/model.h"

namespace zerorun {
// Whether config.json's model_type is one of the decoders hf_decoder_spec reads.
bool hf_decoder_type(const std::string& model_type);
// The spec of a decoder's config.json (`path` names it in errors). A key whose effect zerorun does not compute is
// an error naming it; keys it does not know are listed in `notes`. Dropout is applied in training as transformers
// does, unless `no_dropout` (the user's --no_dropout: train without it, said in a note).
LlamaSpec hf_decoder_spec(const json& config, const std::string& path, std::vector<std::string>* notes,
                          bool no_dropout = false);
// The dropout probability a config's `key` asks for in training (0 where absent), checked to be in [0, 1); with
// no_dropout (the user's --no_dropout) 0, and a note that zerorun trains without it.
double hf_dropout(const json& config, const std::string& path, const char* key, bool no_dropout,
                  std::vector<std::string>* notes);
// The tokenizer and chat-template files of a transformers checkpoint directory that merge copies beside the weights.
inline const std::vector<const char*>& hf_tokenizer_files() {
  static const std::vector<const char*> f = {"tokenizer.json",
                                             "tokenizer_config.json",
                                             "special_tokens_map.json",
                                             "chat_template.jinja",
                                             "chat_template.json",
                                             "tokenizer.model",
                                             "vocab.json",
                                             "merges.txt",
                                             "added_tokens.json"};
  return f;
}
}  // namespace zerorun
