// `zerorun sample` / `zerorun generate`: the command line of include/zerorun/sample.h's run_sample.
#include "sample_cmd.h"

namespace zerorun {

CLI::App* add_sample_command(CLI::App& app, SampleOptions& o) {
  auto* c = app.add_subcommand("sample", "generate text from a model.bin, a checkpoint or a transformers directory");
  c->alias("generate");
  c->add_option("model", o.model, "model.bin, a checkpoint (save_dir or global_step<N>) or a transformers directory")
      ->required();
  c->add_option("--tokenizer", o.tokenizer,
                "tokenizer.json or its directory (default: beside the model, or the directory it was imported from)");
  c->add_option("--prompt", o.prompt, "the text to continue (default: start from BOS / <|endoftext|>)");
  c->add_option("--prompt_ids", o.prompt_ids, "token ids to continue instead, comma separated")->delimiter(',');
  c->add_flag("--chat", o.chat, "render the prompt as a user turn with the tokenizer's chat template");
  c->add_option("--system", o.system, "a system message before the user turn (--chat)");
  c->add_option("--chat_template", o.chat_template, "a .jinja file instead of the tokenizer's template");
  c->add_option("--max_new_tokens", o.max_new_tokens, "tokens to generate at most (default 128)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--temperature", o.sampling.temperature,
                "sample at this temperature (default 0: greedy; --top_k / --top_p alone sample at 1)")
      ->check(CLI::NonNegativeNumber);
  auto* k =
      c->add_option("--top_k", o.sampling.top_k, "sample from the k most likely tokens")->check(CLI::NonNegativeNumber);
  auto* p = c->add_option("--top_p", o.sampling.top_p, "sample from the most likely tokens holding this probability")
                ->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed", o.seed, "the sampling seed (default 0)")->check(CLI::NonNegativeNumber);
  c->add_flag("--ignore_eos", o.ignore_eos, "do not stop at the end-of-sequence token");
  c->add_flag("--ids", o.ids, "print the new token ids instead of text");
  c->add_option("--device", o.device, "auto (default: a GPU when one is visible), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  c->add_flag("--quiet", o.quiet, "no statistics line on stderr");
  c->callback([&o, k, p] {  // --top_k / --top_p without --temperature: sampling at 1
    if (o.sampling.temperature == 0.0 && ((k->count() && o.sampling.top_k > 0) || (p->count() && o.sampling.top_p < 1)))
      o.sampling.temperature = 1.0;
  });
  return c;
}

}  // namespace zerorun
