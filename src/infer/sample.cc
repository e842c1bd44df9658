// `zerorun sample`: picks the next token (greedy or transformers' temperature / top-k / top-p warpers and a draw),
// generates with the Decoder's key/value cache, and finds what a model path holds (model.bin, checkpoint,
// transformers directory), its tokenizer and its end-of-sequence tokens.
#include "zerorun/sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "zerorun/cuda_rt.h"
#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/jinja.h"
#include "zerorun/merge.h"
#include "zerorun/platform.h"
#include "zerorun/tokenizer.h"

namespace zerorun {
namespace fs = std::filesystem;

int32_t pick_token(const float* logits, int64_t V, const Sampling& s, Rng& rng) {
  ZR_CHECK(V > 0, "sample: no logits");
  if (s.temperature <= 0.0)  // greedy: the first of the largest (torch.argmax)
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) z[static_cast<size_t>(i)] = static_cast<double>(logits[i]) / s.temperature;
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return z[static_cast<size_t>(a)] > z[static_cast<size_t>(b)]; });
  size_t keep = order.size();
  if (s.top_k > 0 && s.top_k < V) {  // TopKLogitsWarper: every score below the k-th largest goes (ties stay)
    const double kth = z[static_cast<size_t>(order[static_cast<size_t>(s.top_k - 1)])];
    keep = static_cast<size_t>(s.top_k);
    while (keep < order.size() && z[static_cast<size_t>(order[keep])] >= kth) ++keep;
  }
  // Probabilities of the kept tokens, largest first.
  std::vector<double> p(keep);
  const double mx = z[static_cast<size_t>(order[0])];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(z[static_cast<size_t>(order[i])] - mx);
  for (double& v : p) v /= sum;
  if (s.top_p < 1.0) {  // TopPLogitsWarper: from the smallest up, drop while the dropped mass stays <= 1 - top_p
    double low = 0;
    size_t k = keep;
    while (k > 1 && low + p[k - 1] <= 1.0 - s.top_p) low += p[--k];
    keep = k;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
    for (size_t i = 0; i < keep; ++i) p[i] /= sum;
  }
  const double u = rng.uniform();
  double c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (u < c) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t max_new, const Sampling& s,
                              uint64_t seed, const std::vector<int32_t>& eos,
                              const std::function<void(int32_t)>& on_token) {
  ZR_CHECK(d.length() == 0, "generate: the decoder already holds ", d.length(), " tokens");
  ZR_CHECK(!prompt.empty(), "generate: an empty prompt");
  std::vector<int32_t> out;
  if (max_new <= 0) return out;
  Rng rng(seed);
  std::vector<float> lg = d.feed(prompt);
  for (int64_t k = 0; k < max_new; ++k) {
    const int32_t t = pick_token(lg.data(), d.vocab(), s, rng);
    out.push_back(t);
    if (on_token) on_token(t);
    if (std::find(eos.begin(), eos.end(), t) != eos.end() || k + 1 == max_new) break;
    lg = d.feed({t});
  }
  return out;
}

namespace {

bool is_file(const std::string& p) { return fs::is_regular_file(platform::to_path(p)); }

// What a model path holds, loaded as f32; the tokenizer directory it names ("" if none).
struct Loaded {
  Model model;
  std::string tokenizer, what;
};

Loaded load_any(const std::string& path) {
  Loaded l;
  ZR_CHECK(path_exists(path), "sample: ", path, " does not exist (give a model.bin, a checkpoint or a transformers ",
           "directory)");
  if (!is_directory(path)) {
    l.model = load_model(path);
    l.what = "model.bin";
    const std::string dir = platform::generic_path(platform::to_path(path).parent_path());
    if (is_file((dir.empty() ? "." : dir) + "/tokenizer.json")) l.tokenizer = dir.empty() ? "." : dir;
  } else if (is_file(path + "/manifest.json") || is_file(path + "/latest")) {
    // A checkpoint: its full weights merged (zerorun layout) into a temporary directory, read, removed.
    std::mt19937_64 r(std::random_device{}());
    const fs::path tmp = platform::to_path(platform::temp_dir()) / ("zerorun-sample-" + std::to_string(r()));
    try {
      MergeResult m = merge_checkpoint(path, "", platform::generic_path(tmp), DType::F32, MergeLayout::Zerorun);
      l.model = load_model(m.model_bin);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    std::error_code ec;
    fs::remove_all(tmp, ec);
    l.what = "checkpoint";
  } else if (is_file(path + "/config.json")) {
    l.model = import_hf(path);
    l.what = "transformers directory";
    if (is_file(path + "/tokenizer.json")) l.tokenizer = path;
  } else if (is_file(path + "/model.bin")) {
    l.model = load_model(path + "/model.bin");
    l.what = "model.bin";
    if (is_file(path + "/tokenizer.json")) l.tokenizer = path;
  } else {
    ZR_FAIL("sample: ", path, " is a directory without manifest.json / latest (a checkpoint), config.json (a ",
            "transformers directory) or model.bin");
  }
  if (l.tokenizer.empty()) {  // the directory the model was imported from
    const json t = l.model.graph.meta.value("hf_tokenizer", json());
    if (t.is_object() && t.contains("dir") && is_file(t["dir"].get<std::string>() + "/tokenizer.json"))
      l.tokenizer = t["dir"].get<std::string>();
  }
  return l;
}

// generation_config.json's eos_token_id (an id or a list), else config.json's.
std::vector<int32_t> eos_ids(const Model& m) {
  std::vector<int32_t> r;
  for (const char* k : {"hf_generation_config", "hf_config"}) {
    json c = m.graph.meta.value(k, json());
    if (c.is_object() && c.contains("text_config") && !c.contains("eos_token_id")) c = c["text_config"];
    if (!c.is_object() || !c.contains("eos_token_id")) continue;
    const json& e = c["eos_token_id"];
    if (e.is_number_integer()) r.push_back(e.get<int32_t>());
    if (e.is_array())
      for (const json& x : e)
        if (x.is_number_integer()) r.push_back(x.get<int32_t>());
    if (!r.empty()) break;
  }
  return r;
}

}  // namespace

int run_sample(const SampleOptions& o) {
  Loaded l = load_any(o.model);
  const std::string tok_path = o.tokenizer.empty() ? l.tokenizer : o.tokenizer;
  std::unique_ptr<Tokenizer> tok;
  if (!tok_path.empty()) tok = std::make_unique<Tokenizer>(Tokenizer::load(tok_path));
  ZR_CHECK(tok || (o.ids && !o.prompt_ids.empty()), "sample: no tokenizer for ", o.model,
           " (none beside it or in the directory it was imported from): give --tokenizer DIR_OR_JSON");
  std::vector<int32_t> prompt = o.prompt_ids;
  const bool prompt_is_text = prompt.empty() && !o.prompt.empty();
  if (prompt.empty()) {
    ZR_CHECK(tok, "sample: --prompt needs a tokenizer");
    if (o.chat) {
      std::string tmpl = o.chat_template.empty() ? tok->chat_template() : read_file(o.chat_template);
      ZR_CHECK(!tmpl.empty(), "sample: --chat needs a chat template: ", tok->source(),
               " has none (give --chat_template F.jinja)");
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
      if (!o.system.empty()) msgs.push_back({{"role", "system"}, {"content", o.system}});
      msgs.push_back({{"role", "user"}, {"content", o.prompt}});
      const nlohmann::ordered_json ctx = {{"messages", msgs},
                                          {"add_generation_prompt", true},
                                          {"bos_token", tok->bos_token()},
                                          {"eos_token", tok->eos_token()}};
      const std::string text =
          JinjaTemplate(tmpl, o.chat_template.empty() ? tok->source() + " chat_template" : o.chat_template).render(ctx);
      prompt = tok->encode(text, false);  // the template writes the special tokens itself
    } else if (!o.prompt.empty()) {
      prompt = tok->encode(o.prompt, true);
    }
    if (prompt.empty()) {  // nothing to continue: start from BOS (or GPT-2's <|endoftext|>)
      const int32_t start = tok->bos_id() >= 0 ? tok->bos_id() : tok->eos_id();
      ZR_CHECK(start >= 0, "sample: an empty prompt and no BOS or EOS token to start from: give --prompt");
      prompt = {start};
    }
  }
  std::vector<int32_t> eos;
  if (!o.ignore_eos) {
    eos = eos_ids(l.model);
    if (eos.empty() && tok && tok->eos_id() >= 0) eos.push_back(tok->eos_id());
  }
  Device dev = Device::cpu();
  ZR_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "sample: --device must be auto, cpu or ",
           "cuda, got '", o.device, "'");
  if (o.device == "cuda" || (o.device == "auto" && cuda::available())) {
    ZR_CHECK(cuda::available(), "sample: --device cuda, but ",
             "no GPU is visible (or this zerorun is built without CUDA)");
    cuda::set_device(0);
    dev = Device::cuda(0);
  }
  int64_t max_new = o.max_new_tokens;
  const int64_t P = static_cast<int64_t>(prompt.size());
  Decoder probe(l.model, Device::cpu(), 1);  // sizes only (no weights copied on the CPU)
  const int64_t limit = probe.max_positions();
  ZR_CHECK(limit == 0 || P < limit, "sample: the prompt's ", P, " tokens fill the model's context of ", limit);
  if (limit > 0 && P + max_new > limit) {
    if (!o.quiet)
      std::fprintf(stderr, "[zerorun] sample: %lld new tokens at most: the model's context is %lld tokens\n",
                   static_cast<long long>(limit - P), static_cast<long long>(limit));
    max_new = limit - P;
  }
  Decoder d(l.model, dev, P + std::max<int64_t>(max_new, 1));
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<DecodeStream> stream;
  if (tok && !o.ids) stream = std::make_unique<DecodeStream>(*tok, true);
  if (stream && !o.chat && prompt_is_text) {  // the text continued, then its continuation (transformers' full text)
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    std::fflush(stdout);
  }
  bool told = false;
  const std::vector<int32_t> out = generate(d, prompt, max_new, o.sampling, o.seed, eos, [&](int32_t t) {
    if (!stream) return;
    if (t >= tok->vocab_size() && !told) {  // a padded vocabulary's row: decoded as nothing (tokenizer.h)
      told = true;
      std::fprintf(stderr,
                   "\n[zerorun] sample: generated id %d, which %s has no token for (it has %lld; the model %lld): "
                   "it prints as nothing, as in transformers\n",
                   t, tok->source().c_str(), static_cast<long long>(tok->vocab_size()),
                   static_cast<long long>(d.vocab()));
    }
    const std::string piece = stream->push(t);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.ids)
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  std::printf("\n");
  std::fflush(stdout);
  if (!o.quiet)
    std::fprintf(stderr, "[zerorun] sample: %s %s, %lld prompt tokens, %zu new in %.2f s (%.1f tokens/s) on %s\n",
                 l.what.c_str(), o.model.c_str(), static_cast<long long>(P), out.size(), secs,
                 secs > 0 ? static_cast<double>(out.size()) / secs : 0.0, dev.is_cpu() ? "cpu" : "cuda");
  return 0;
}

}  // namespace zerorun
