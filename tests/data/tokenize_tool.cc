// Test driver for zerorun's tokenizer (tests/data/tokenizer_oracle.sh): encodes documents the way
// tokenizer_oracle.mjs does with transformers.js, or measures throughput.
//   zerorun_tokenize_tool TOKENIZER DOCS.jsonl OUT.jsonl [THREADS]
//       one line a document: {"ids": [...add_special_tokens], "plain": [...without], "decoded": decode(plain)}
//   zerorun_tokenize_tool --bench TOKENIZER TEXT_FILE THREADS
//       encodes the file's lines (one document a line) and prints tokens and MB/s
//   zerorun_tokenize_tool --dump SHARD [TOKENIZER]
//       one line a document of a token shard: {"ids": [...], "mask": [...], "targets": decode(masked-in ids)}
//   zerorun_tokenize_tool --chat CASES.json OUT.jsonl NAME=TEMPLATE...
//       renders each chat template (a .jinja file, or a tokenizer_config.json's chat_template) with each case,
//       as jinja_oracle.mjs does with @huggingface/jinja
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/jinja.h"
#include "zerorun/tokenizer.h"

int main(int argc, char** argv) {
  try {
    if (argc == 5 && std::string(argv[1]) == "--bench") {
      const auto t0 = std::chrono::steady_clock::now();
      zerorun::Tokenizer tok = zerorun::Tokenizer::load(argv[2]);
      const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::ifstream in(argv[3]);
      std::vector<std::string> docs;
      size_t bytes = 0;
      for (std::string l; std::getline(in, l);) bytes += l.size() + 1, docs.push_back(l + "\n");
      const auto t1 = std::chrono::steady_clock::now();
      auto ids = tok.encode_batch(docs, false, std::atoi(argv[4]));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      size_t n = 0;
      for (auto& v : ids) n += v.size();
      std::printf("threads %s: %zu docs, %.1f MB, %zu tokens in %.3f s: %.2f MB/s, %.0f tokens/s (load %.2f s)\n",
                  argv[4], docs.size(), bytes / 1e6, n, s, bytes / 1e6 / s, n / s, load_s);
      return 0;
    }
    if (argc >= 3 && std::string(argv[1]) == "--dump") {
      const zerorun::TokenShard s = zerorun::read_token_shard(argv[2]);
      std::unique_ptr<zerorun::Tokenizer> tok;
      if (argc > 3) tok = std::make_unique<zerorun::Tokenizer>(zerorun::Tokenizer::load(argv[3]));
      std::vector<int64_t> starts = s.doc_starts;
      if (starts.empty()) starts = {0, static_cast<int64_t>(s.tokens.size())};
      for (size_t d = 0; d + 1 < starts.size(); ++d) {
        nlohmann::json j;
        std::vector<int32_t> ids, targets;
        std::vector<int> mask;
        for (int64_t i = starts[d]; i < starts[d + 1]; ++i) {
          ids.push_back(static_cast<int32_t>(s.tokens[static_cast<size_t>(i)]));
          mask.push_back(s.loss_mask.empty() ? 1 : s.loss_mask[static_cast<size_t>(i)]);
          if (mask.back()) targets.push_back(ids.back());
        }
        j["ids"] = ids;
        j["mask"] = mask;
        if (tok) j["targets"] = targets.empty() ? "" : tok->decode(targets);
        std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
      return 0;
    }
    if (argc >= 4 && std::string(argv[1]) == "--chat") {
      auto read = [](const std::string& p) {
        std::ifstream f(p);
        ZR_CHECK(f, p, ": cannot open");
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
      };
      const auto cases = nlohmann::ordered_json::parse(read(argv[2]));
      std::ofstream out(argv[3]);
      for (int a = 4; a < argc; ++a) {
        const std::string spec = argv[a];
        const size_t eq = spec.find('=');
        const std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
        std::string text = read(file);
        if (file.size() > 5 && file.compare(file.size() - 5, 5, ".json") == 0)
          text = nlohmann::json::parse(text)["chat_template"].get<std::string>();
        zerorun::JinjaTemplate tpl(text, file);
        for (size_t i = 0; i < cases.size(); ++i) {
          nlohmann::ordered_json j;
          j["template"] = name;
          j["case"] = i;
          try {
            j["out"] = tpl.render(cases[i]);
          } catch (const zerorun::Error& e) {
            j["error"] = true;
            j["message"] = e.what();
          }
          out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        }
      }
      return 0;
    }
    if (argc < 4) {
      std::fprintf(stderr, "usage: %s TOKENIZER DOCS.jsonl OUT.jsonl [THREADS]\n", argv[0]);
      return 2;
    }
    zerorun::Tokenizer tok = zerorun::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2]);
    ZR_CHECK(in, argv[2], ": cannot open");
    std::vector<std::string> docs;
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) docs.push_back(nlohmann::json::parse(l).get<std::string>());
    const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
    auto with = tok.encode_batch(docs, true, threads);
    auto plain = tok.encode_batch(docs, false, threads);
    std::ofstream out(argv[3]);
    for (size_t i = 0; i < docs.size(); ++i) {
      nlohmann::json j;
      j["ids"] = with[i];
      j["plain"] = plain[i];
      j["decoded"] = plain[i].empty() ? "" : tok.decode(plain[i]);
      zerorun::DecodeStream stream(tok);  // token by token, as sampling prints: must add up to the same text
      std::string streamed;
      for (int32_t id : plain[i]) streamed += stream.push(id);
      if (streamed != (plain[i].empty() ? "" : tok.decode(plain[i], false, false))) j["stream_differs"] = streamed;
      out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return 0;
  } catch (const zerorun::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
