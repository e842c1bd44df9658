// Size facts of a model's architecture: training FLOPs per token, the convention of PaLM's MFU and llm.c: 6 per
// parameter (forward 2, backward 4) plus 6·L·C·T for the attention scores and their use (causal masking not
// subtracted), for the step line's TFLOP/s; and the hidden width DeepSpeed's "auto" bucket sizes are made from.
#include <algorithm>

#include "zerorun/model.h"

namespace zerorun {

int64_t model_hidden(const Model& m) {
  const json& ac = m.graph.meta.value("arch_config", json::object());
  for (auto* k : {"n_embd", "hidden_size", "hidden"})
    if (ac.contains(k) && ac[k].is_number_integer() && ac[k].get<int64_t>() > 0 &&
        ac[k].get<int64_t>() <= (int64_t{1} << 24))
      return ac[k].get<int64_t>();
  int64_t h = 0;  // no architecture record: the smaller side of the widest matrix
  for (auto& [n, s] : m.shapes)
    if (s.size() == 2) h = std::max(h, std::min(s[0], s[1]));
  return h;
}

double train_flops_per_token(const Model& m, int64_t T) {
  double f = 6.0 * static_cast<double>(m.num_params());
  const auto& meta = m.graph.meta;
  const std::string arch = meta.value("arch", std::string());
  if (!meta.contains("arch_config")) return f;
  const auto& ac = meta.at("arch_config");
  auto get = [&](const char* k) { return ac.contains(k) && ac.at(k).is_number() ? ac.at(k).get<double>() : 0.0; };
  if (arch == "gpt2") f += 6.0 * get("n_layer") * get("n_embd") * static_cast<double>(T);
  // The attention width is heads x head size (head_dim where it is not hidden_size / heads: Qwen3, Gemma).
  const double width = get("head_dim") > 0 ? get("head_dim") * get("num_attention_heads") : get("hidden_size");
  if (arch == "llama") f += 6.0 * get("num_hidden_layers") * width * static_cast<double>(T);
  return f;
}

}  // namespace zerorun
