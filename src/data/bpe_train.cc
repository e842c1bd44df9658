// Byte-level BPE training (zerorun/tokenizer.h): words from GPT-2's pre-tokenizer regex, counted; pairs counted
// over the distinct words weighted by frequency; each step merges the most frequent pair (a lazy max-heap), updating
// only the words that hold it.

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "regex.h"
#include "unicode.h"
#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"
#include "zerorun/tokenizer.h"

namespace zerorun {
namespace {

std::string byte_symbol(unsigned char b) {  // GPT-2's printable stand-in of a byte
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      unicode::append_utf8(t[static_cast<size_t>(c)],
                           printable ? static_cast<uint32_t>(c) : static_cast<uint32_t>(256 + n++));
    }
    return t;
  }();
  return table[b];
}

}  // namespace

int64_t train_bpe_tokenizer(const TokenizerTrainOptions& o) {
  ZR_CHECK(!o.inputs.empty(), "tokenizer: no input files given");
  ZR_CHECK(!o.out_dir.empty(), "tokenizer: no output directory (-o)");
  const int64_t base = static_cast<int64_t>(o.special.size()) + 256;
  ZR_CHECK(o.vocab_size >= base, "tokenizer: --vocab_size ", o.vocab_size, " is below the ", base,
           " ids the special tokens and the 256 bytes take");
  std::vector<std::string> files;
  for (const std::string& spec : o.inputs) {
    const std::vector<std::string> found = platform::glob(spec);
    files.insert(files.end(), found.begin(), found.end());
    ZR_CHECK(!found.empty(), "tokenizer: no file matches '", spec, "'");
  }
  // Words (as byte symbols) and their counts.
  const Regex re("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
  std::unordered_map<std::string, int64_t> counts;
  auto add_text = [&](const std::string& text) {
    const std::vector<uint32_t> cps = unicode::to_cps(text);
    for (auto [a, b] : re.find_all(cps)) {
      std::string w;
      for (size_t i = a; i < b; ++i) unicode::append_utf8(w, cps[i]);
      ++counts[w];
    }
  };
  for (const std::string& f : files) {
    ZR_CHECK(!is_directory(f), "tokenizer: ", f, " is a directory");
    const bool jsonl = f.size() > 6 && f.compare(f.size() - 6, 6, ".jsonl") == 0;
    if (!jsonl) {
      add_text(read_file(f));
      continue;
    }
    std::ifstream in(platform::to_path(f));
    int64_t line = 0;
    for (std::string l; std::getline(in, l);) {
      ++line;
      if (l.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(l);
      } catch (const nlohmann::json::exception& e) {
        ZR_FAIL(f, ":", line, ": not valid JSON: ", e.what());
      }
      ZR_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), f, ":", line,
               ": tokenizer training reads {\"text\": ...} records");
      add_text(j["text"].get<std::string>());
    }
  }
  // Symbols: the special tokens, the 256 bytes, then merges.
  std::vector<std::string> sym(o.special);
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < sym.size(); ++i) id_of[sym[i]] = static_cast<int32_t>(i);
  for (int b = 0; b < 256; ++b) {
    id_of[byte_symbol(static_cast<unsigned char>(b))] = static_cast<int32_t>(sym.size());
    sym.push_back(byte_symbol(static_cast<unsigned char>(b)));
  }
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  {
    std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
    std::sort(sorted.begin(), sorted.end());  // a fixed order: the result does not depend on hashing
    for (auto& [w, c] : sorted) {
      std::vector<int32_t> ids;
      for (unsigned char ch : w) ids.push_back(id_of.at(byte_symbol(ch)));
      words.push_back(std::move(ids));
      freq.push_back(c);
    }
  }
  auto key = [](int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // word indices (may repeat or be stale)
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const uint64_t k = key(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      where[k].push_back(static_cast<int32_t>(w));
    }
  // Max-heap on (count, then the smaller pair of strings); stale entries are skipped.
  struct Item {
    int64_t count;
    uint64_t pair;
  };
  auto worse = [&](const Item& x, const Item& y) {
    if (x.count != y.count) return x.count < y.count;
    const auto a = std::make_pair(sym[x.pair >> 32], sym[x.pair & 0xffffffff]);
    const auto b = std::make_pair(sym[y.pair >> 32], sym[y.pair & 0xffffffff]);
    return a > b;
  };
  std::priority_queue<Item, std::vector<Item>, decltype(worse)> heap(worse);
  for (auto& [k, c] : pair_count) heap.push({c, k});
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int64_t>(sym.size()) < o.vocab_size && !heap.empty()) {
    const Item top = heap.top();
    heap.pop();
    auto it = pair_count.find(top.pair);
    if (it == pair_count.end() || it->second != top.count) continue;  // stale
    if (top.count < o.min_frequency) break;
    const int32_t a = static_cast<int32_t>(top.pair >> 32), b = static_cast<int32_t>(top.pair & 0xffffffff);
    const std::string merged = sym[static_cast<size_t>(a)] + sym[static_cast<size_t>(b)];
    int32_t nid;
    auto known = id_of.find(merged);
    if (known != id_of.end()) {
      nid = known->second;
    } else {
      nid = static_cast<int32_t>(sym.size());
      sym.push_back(merged);
      id_of[merged] = nid;
    }
    merges.push_back({sym[static_cast<size_t>(a)], sym[static_cast<size_t>(b)]});
    std::unordered_map<uint64_t, int64_t> delta;
    std::vector<int32_t> list = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    for (int32_t wi : list) {
      std::vector<int32_t>& w = words[static_cast<size_t>(wi)];
      const int64_t f = freq[static_cast<size_t>(wi)];
      bool has = false;
      for (size_t i = 0; i + 1 < w.size(); ++i) has = has || (w[i] == a && w[i + 1] == b);
      if (!has) continue;
      for (size_t i = 0; i + 1 < w.size(); ++i) delta[key(w[i], w[i + 1])] -= f;
      std::vector<int32_t> nw;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          nw.push_back(nid);
          ++i;
        } else {
          nw.push_back(w[i]);
        }
      }
      w.swap(nw);
      for (size_t i = 0; i + 1 < w.size(); ++i) {
        const uint64_t k = key(w[i], w[i + 1]);
        delta[k] += f;
        if (w[i] == nid || w[i + 1] == nid) where[k].push_back(wi);
      }
    }
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (c <= 0) {
        pair_count.erase(k);
      } else {
        heap.push({c, k});
      }
    }
    pair_count.erase(top.pair);
  }
  // tokenizer.json as transformers writes a GPT-2-style byte-level BPE.
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < sym.size(); ++i) vocab[sym[i]] = i;
  nlohmann::ordered_json merges_j = nlohmann::ordered_json::array();
  for (auto& [x, y] : merges) merges_j.push_back(x + " " + y);
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (size_t i = 0; i < o.special.size(); ++i)
    added.push_back({{"id", i},
                     {"content", o.special[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json tj = {{"version", "1.0"},
                               {"truncation", nullptr},
                               {"padding", nullptr},
                               {"added_tokens", added},
                               {"normalizer", nullptr},
                               {"pre_tokenizer", byte_level},
                               {"post_processor", byte_level},
                               {"decoder", byte_level},
                               {"model",
                                {{"type", "BPE"},
                                 {"dropout", nullptr},
                                 {"unk_token", nullptr},
                                 {"continuing_subword_prefix", ""},
                                 {"end_of_word_suffix", ""},
                                 {"fuse_unk", false},
                                 {"byte_fallback", false},
                                 {"ignore_merges", false},
                                 {"vocab", vocab},
                                 {"merges", merges_j}}}};
  nlohmann::ordered_json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                {"clean_up_tokenization_spaces", false},
                                {"model_max_length", 1000000000}};
  if (!o.special.empty()) {
    cfg["bos_token"] = o.special[0];
    cfg["eos_token"] = o.special[0];
    cfg["unk_token"] = o.special[0];
  }
  make_dirs(o.out_dir);
  write_file_atomic(o.out_dir + "/tokenizer.json",
                    tj.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n");
  write_file_atomic(o.out_dir + "/tokenizer_config.json", cfg.dump(2) + "\n");
  return static_cast<int64_t>(sym.size());
}

}  // namespace zerorun
