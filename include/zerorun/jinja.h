// A Jinja subset for chat templates (tokenizer_config.json's chat_template, chat_template.jinja), rendering as
// transformers' apply_chat_template does (trim_blocks, lstrip_blocks, the trailing newline dropped). Covers the
// templates of Llama 3/3.1, Qwen2.5/3, Mistral, Gemma, Phi-3 and SmolLM, checked against @huggingface/jinja
// (tests/data/jinja_oracle.sh): {{ }}, {% if/elif/else %}, {% for %} (loop.*, else, unpacking, `if` filter),
// {% set %} (namespace attributes, block set), {% macro %}, break/continue, whitespace control, comments;
// expressions with Python-like strings, lists, dicts, slices, operators, `is` tests, filters and string/dict
// methods; raise_exception, namespace, range, strftime_now.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace zerorun {

class JinjaTemplate {
 public:
  // Throws zerorun::Error naming `source` and the line at fault.
  explicit JinjaTemplate(const std::string& text, const std::string& source = "chat_template");
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  // Renders with the variables of `context` (a JSON object: messages, add_generation_prompt, bos_token, ...).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerorun
