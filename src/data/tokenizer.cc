// tokenizer.json: the transformers tokenization pipeline (see zerorun/tokenizer.h). The order of work follows
// transformers.js, the oracle of tests/data/tokenizer_oracle.sh: added tokens are split out of the raw text
// (those with normalized=false), each remaining section is normalized and split again on the normalized added
// tokens, pre-tokenized, and each pre-token run through the model; the post-processor adds template tokens.
#include "zerorun/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "regex.h"
#include "unicode.h"
#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"

namespace zerorun {
namespace {

using json = nlohmann::json;
using unicode::append_utf8;
using unicode::next_cp;

bool starts_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) out.append(s, i, j - i).append(to);
  out.append(s, i, std::string::npos);
  s.swap(out);
}

// Leading / trailing White_Space removed.
std::string_view trim_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!unicode::is_white_space(next_cp(s, j))) break;
    i = j;
  }
  return s.substr(i);
}
std::string_view trim_end(std::string_view s) {
  size_t keep = 0;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_cp(s, i);
    if (!unicode::is_white_space(cp)) keep = i;
  }
  return s.substr(0, keep);
}

std::string str_or_content(const json& j) {  // "<s>" or {"content": "<s>", ...}
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ----
struct ByteAlphabet {
  std::string enc[256];  // byte -> UTF-8 of its printable stand-in
  std::unordered_map<uint32_t, uint8_t> dec;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(enc[b], cp);
      dec[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// A pattern of a Split / Replace: a literal string or a regex, found as byte spans.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;
  Pattern() = default;
  Pattern(const json& j, const std::string& where) {
    ZR_CHECK(j.is_object(), where, ": 'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
    if (j.contains("String")) {
      literal = j["String"].get<std::string>();
      ZR_CHECK(!literal.empty(), where, ": empty String pattern");
    } else if (j.contains("Regex")) {
      try {
        regex = std::make_shared<Regex>(j["Regex"].get<std::string>());
      } catch (const Error& e) {
        throw e.with_context(where);
      }
    } else {
      ZR_FAIL(where, ": 'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
    }
  }
  std::vector<std::pair<size_t, size_t>> find(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (!regex) {
      for (size_t i = 0; (i = s.find(literal, i)) != std::string_view::npos; i += literal.size())
        out.push_back({i, i + literal.size()});
      return out;
    }
    return find_regex(*regex, s);
  }
  // Byte spans of the matches of `re` in s.
  static std::vector<std::pair<size_t, size_t>> find_regex(const Regex& re, std::string_view s) {
    std::vector<std::pair<size_t, size_t>> out;
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    cps.reserve(s.size());
    off.reserve(s.size() + 1);
    for (size_t i = 0; i < s.size();) {
      off.push_back(i);
      cps.push_back(next_cp(s, i));
    }
    off.push_back(s.size());
    for (auto [a, b] : re.find_all(cps)) out.push_back({off[a], off[b]});
    return out;
  }
};

// ---- normalizers ----
struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};
struct NormSeq : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> parts;
  void apply(std::string& s) const override {
    for (auto& p : parts) p->apply(s);
  }
};
struct NormNfc : Normalizer {
  void apply(std::string& s) const override { s = unicode::nfc(s); }
};
struct NormNfd : Normalizer {
  void apply(std::string& s) const override { s = unicode::nfd(s); }
};
struct NormPrepend : Normalizer {
  std::string prepend;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend);
  }
};
struct NormReplace : Normalizer {
  Pattern pat;
  std::string content;
  void apply(std::string& s) const override {
    if (!pat.regex) return replace_all(s, pat.literal, content);
    std::string out;
    size_t last = 0;
    for (auto [a, b] : pat.find(s)) out.append(s, last, a - last).append(content), last = b;
    out.append(s, last, std::string::npos);
    s.swap(out);
  }
};
struct NormStrip : Normalizer {
  bool left = true, right = true;
  void apply(std::string& s) const override {
    std::string_view v = s;
    if (left) v = trim_start(v);
    if (right) v = trim_end(v);
    s = std::string(v);
  }
};

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    auto s = std::make_unique<NormSeq>();
    for (size_t i = 0; i < j.at("normalizers").size(); ++i)
      if (auto p = make_normalizer(j["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]"))
        s->parts.push_back(std::move(p));
    return s;
  }
  if (type == "NFC") return std::make_unique<NormNfc>();
  if (type == "NFD") return std::make_unique<NormNfd>();
  if (type == "Prepend") {
    auto p = std::make_unique<NormPrepend>();
    p->prepend = j.at("prepend").get<std::string>();
    return p;
  }
  if (type == "Replace") {
    auto p = std::make_unique<NormReplace>();
    p->pat = Pattern(j.at("pattern"), w);
    p->content = j.value("content", "");
    return p;
  }
  if (type == "Strip") {
    auto p = std::make_unique<NormStrip>();
    p->left = j.value("strip_left", true);
    p->right = j.value("strip_right", true);
    return p;
  }
  ZR_FAIL(where, ": normalizer type '", type,
          "' is not supported (supported: Sequence, NFC, NFD, Prepend, Replace, Strip)");
}

// ---- pre-tokenizers: each splits every piece into smaller pieces ----
using Pieces = std::vector<std::string>;
struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void split(std::string_view s, size_t section, Pieces& out) const = 0;
  void apply(Pieces& pieces, size_t section) const {
    Pieces out;
    out.reserve(pieces.size());
    for (auto& p : pieces) split(p, section, out);
    pieces.swap(out);
  }
};
struct PreSeq : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void split(std::string_view s, size_t section, Pieces& out) const override {
    Pieces p{std::string(s)};
    for (auto& t : parts) t->apply(p, section);
    for (auto& x : p) out.push_back(std::move(x));
  }
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
Behavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  ZR_FAIL(where, ": unknown split behavior '", b, "'");
}

// Splits s by the spans `m` (sorted, disjoint) as tokenizers' SplitDelimiterBehavior does.
void split_by(std::string_view s, const std::vector<std::pair<size_t, size_t>>& m, bool invert, Behavior beh,
              Pieces& out) {
  struct Part {
    size_t a, b;
    bool match;
  };
  std::vector<Part> parts;
  size_t last = 0;
  for (auto [a, b] : m) {
    if (a > last) parts.push_back({last, a, invert});
    parts.push_back({a, b, !invert});
    last = b;
  }
  if (last < s.size()) parts.push_back({last, s.size(), invert});
  std::vector<std::pair<size_t, size_t>> res;
  switch (beh) {
    case Behavior::Removed:
      for (auto& p : parts)
        if (!p.match) res.push_back({p.a, p.b});
      break;
    case Behavior::Isolated:
      for (auto& p : parts) res.push_back({p.a, p.b});
      break;
    case Behavior::Contiguous:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].match && i > 0 && parts[i - 1].match && !res.empty())
          res.back().second = parts[i].b;
        else
          res.push_back({parts[i].a, parts[i].b});
      }
      break;
    case Behavior::MergedWithPrevious:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].match && !res.empty() && !parts[i - 1].match)
          res.back().second = parts[i].b;
        else
          res.push_back({parts[i].a, parts[i].b});
      }
      break;
    case Behavior::MergedWithNext: {
      bool pending = false;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (pending && !parts[i].match)
          res.back().second = parts[i].b, pending = false;
        else
          res.push_back({parts[i].a, parts[i].b}), pending = parts[i].match;
      }
      break;
    }
  }
  for (auto [a, b] : res)
    if (b > a) out.emplace_back(s.substr(a, b - a));
}

struct PreSplit : PreTokenizer {
  Pattern pat;
  Behavior beh = Behavior::Isolated;
  bool invert = false;
  void split(std::string_view s, size_t, Pieces& out) const override { split_by(s, pat.find(s), invert, beh, out); }
};
struct PreByteLevel : PreTokenizer {
  bool add_prefix_space = false, use_regex = true;
  std::shared_ptr<Regex> regex;
  void split(std::string_view s, size_t, Pieces& out) const override {
    std::string text;
    if (add_prefix_space && !starts_with(s, " ")) {
      text = " ";
      text += s;
      s = text;
    }
    const ByteAlphabet& ab = byte_alphabet();
    auto emit = [&](std::string_view piece) {
      std::string o;
      o.reserve(piece.size() * 2);
      for (unsigned char c : piece) o += ab.enc[c];
      out.push_back(std::move(o));
    };
    if (!use_regex) return emit(s);
    Pieces tmp;
    split_by(s, Pattern::find_regex(*regex, s), false, Behavior::Isolated, tmp);
    for (auto& t : tmp) emit(t);
  }
};
struct PreMetaspace : PreTokenizer {
  std::string replacement = "\xE2\x96\x81";
  std::string scheme = "always";  // always | first | never
  bool split_words = true;
  void split(std::string_view s, size_t section, Pieces& out) const override {
    std::string t(s);
    replace_all(t, " ", replacement);
    if (!starts_with(t, replacement) && (scheme == "always" || (scheme == "first" && section == 0)))
      t.insert(0, replacement);
    if (!split_words) return out.push_back(std::move(t));
    std::vector<std::pair<size_t, size_t>> m;
    for (size_t i = 0; (i = t.find(replacement, i)) != std::string::npos; i += replacement.size())
      m.push_back({i, i + replacement.size()});
    split_by(t, m, false, Behavior::MergedWithNext, out);
  }
};
struct PreRegexKeep : PreTokenizer {  // Whitespace / WhitespaceSplit: only the regex's matches are kept
  std::shared_ptr<Regex> regex;
  void split(std::string_view s, size_t, Pieces& out) const override {
    split_by(s, Pattern::find_regex(*regex, s), true, Behavior::Removed, out);
  }
};
struct PreDigits : PreTokenizer {
  bool individual = false;
  void split(std::string_view s, size_t, Pieces& out) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (size_t i = 0; i < s.size();) {
      size_t j = i;
      const uint32_t cp = next_cp(s, j);
      if (cp >= '0' && cp <= '9') {  // ASCII digits, as both reference implementations split
        if (!individual && !m.empty() && m.back().second == i)
          m.back().second = j;
        else
          m.push_back({i, j});
      }
      i = j;
    }
    split_by(s, m, false, Behavior::Isolated, out);
  }
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    auto s = std::make_unique<PreSeq>();
    for (size_t i = 0; i < j.at("pretokenizers").size(); ++i)
      if (auto p = make_pre_tokenizer(j["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]"))
        s->parts.push_back(std::move(p));
    return s;
  }
  if (type == "Split") {
    auto p = std::make_unique<PreSplit>();
    p->pat = Pattern(j.at("pattern"), w);
    p->beh = parse_behavior(j.value("behavior", "Isolated"), w);
    p->invert = j.value("invert", false);
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<PreByteLevel>();
    p->add_prefix_space = j.value("add_prefix_space", false);
    p->use_regex = j.value("use_regex", true);
    static const auto gpt2 = std::make_shared<Regex>(kGpt2Pattern);
    p->regex = gpt2;
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<PreMetaspace>();
    if (j.contains("replacement")) p->replacement = j["replacement"].get<std::string>();
    if (j.contains("prepend_scheme"))
      p->scheme = j["prepend_scheme"].get<std::string>();
    else if (j.contains("add_prefix_space"))
      p->scheme = j["add_prefix_space"].get<bool>() ? "always" : "never";
    ZR_CHECK(p->scheme == "always" || p->scheme == "first" || p->scheme == "never", w, ": prepend_scheme '", p->scheme,
             "' must be always, first or never");
    p->split_words = j.value("split", true);
    return p;
  }
  if (type == "Whitespace" || type == "WhitespaceSplit") {
    auto p = std::make_unique<PreRegexKeep>();
    // Whitespace keeps \w+ and [^\w\s]+ runs; WhitespaceSplit keeps the runs between white space.
    p->regex = std::make_shared<Regex>(type == "Whitespace" ? "\\w+|[^\\w\\s]+" : "\\S+");
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<PreDigits>();
    p->individual = j.value("individual_digits", false);
    return p;
  }
  ZR_FAIL(where, ": pre-tokenizer type '", type,
          "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, "
          "Digits)");
}

// ---- decoders: each maps the list of token strings ----
struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& toks) const = 0;
};
struct DecSeq : Decoder {
  std::vector<std::unique_ptr<Decoder>> parts;
  void apply(std::vector<std::string>& t) const override {
    for (auto& p : parts) p->apply(t);
  }
};
// Bytes to text; invalid UTF-8 becomes U+FFFD (per maximal subpart, like TextDecoder and String::from_utf8_lossy).
std::string lossy_utf8(const std::string& b) {
  std::string out;
  out.reserve(b.size());
  for (size_t i = 0; i < b.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(b, i);
    if (cp == 0xFFFD && !(b.size() - start >= 3 && b.compare(start, 3, "\xEF\xBF\xBD") == 0)) {
      // Skip the continuation bytes that a valid prefix of a longer sequence would have used.
      const unsigned char c = static_cast<unsigned char>(b[start]);
      const int need = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : 0;
      size_t k = start + 1;
      for (int n = 0; n < need && k < b.size(); ++n, ++k) {
        const unsigned char d = static_cast<unsigned char>(b[k]);
        unsigned char lo = 0x80, hi = 0xBF;
        if (n == 0 && c == 0xE0) lo = 0xA0;
        if (n == 0 && c == 0xED) hi = 0x9F;
        if (n == 0 && c == 0xF0) lo = 0x90;
        if (n == 0 && c == 0xF4) hi = 0x8F;
        if (d < lo || d > hi) break;
      }
      i = k;
    }
    append_utf8(out, cp);
  }
  return out;
}
struct DecByteLevel : Decoder {
  const std::unordered_map<std::string, int32_t>* added = nullptr;
  void apply(std::vector<std::string>& t) const override {
    const ByteAlphabet& ab = byte_alphabet();
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (!bytes.empty()) out.push_back(lossy_utf8(bytes));
      bytes.clear();
    };
    for (auto& tok : t) {
      if (added && added->count(tok)) {
        flush();
        out.push_back(tok);
        continue;
      }
      for (size_t i = 0; i < tok.size();) {
        const size_t s = i;
        const uint32_t cp = next_cp(tok, i);
        auto it = ab.dec.find(cp);
        if (it != ab.dec.end())
          bytes.push_back(static_cast<char>(it->second));
        else
          bytes.append(tok, s, i - s);
      }
    }
    flush();
    t.swap(out);
  }
};
struct DecReplace : Decoder {
  NormReplace r;
  void apply(std::vector<std::string>& t) const override {
    for (auto& s : t) r.apply(s);
  }
};
struct DecByteFallback : Decoder {
  void apply(std::vector<std::string>& t) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool have = false;
    for (auto& tok : t) {
      if (tok.size() == 6 && starts_with(tok, "<0x") && tok[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(tok[3])) && std::isxdigit(static_cast<unsigned char>(tok[4]))) {
        bytes.push_back(static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
        have = true;
        continue;
      }
      if (have) out.push_back(lossy_utf8(bytes)), bytes.clear(), have = false;
      out.push_back(tok);
    }
    if (have) out.push_back(lossy_utf8(bytes));
    t.swap(out);
  }
};
struct DecFuse : Decoder {
  void apply(std::vector<std::string>& t) const override {
    std::string all;
    for (auto& s : t) all += s;
    t.assign(1, all);
  }
};
struct DecStrip : Decoder {
  std::string content;
  int start = 0, stop = 0;
  void apply(std::vector<std::string>& t) const override {
    for (auto& s : t) {
      for (int i = 0; i < start && starts_with(s, content); ++i) s.erase(0, content.size());
      for (int i = 0;
           i < stop && s.size() >= content.size() && s.compare(s.size() - content.size(), content.size(), content) == 0;
           ++i)
        s.resize(s.size() - content.size());
    }
  }
};
struct DecMetaspace : Decoder {
  std::string replacement = "\xE2\x96\x81";
  bool prepend = true;
  void apply(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      replace_all(t[i], replacement, " ");
      if (i == 0 && prepend && starts_with(t[i], " ")) t[i].erase(0, 1);
    }
  }
};

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where,
                                      const std::unordered_map<std::string, int32_t>* added) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    auto s = std::make_unique<DecSeq>();
    for (size_t i = 0; i < j.at("decoders").size(); ++i)
      if (auto p = make_decoder(j["decoders"][i], where + ".decoders[" + std::to_string(i) + "]", added))
        s->parts.push_back(std::move(p));
    return s;
  }
  if (type == "ByteLevel") {
    auto d = std::make_unique<DecByteLevel>();
    d->added = added;
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<DecReplace>();
    d->r.pat = Pattern(j.at("pattern"), w);
    d->r.content = j.value("content", "");
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<DecByteFallback>();
  if (type == "Fuse") return std::make_unique<DecFuse>();
  if (type == "Strip") {
    auto d = std::make_unique<DecStrip>();
    d->content = j.value("content", " ");
    d->start = j.value("start", 0);
    d->stop = j.value("stop", 0);
    return d;
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<DecMetaspace>();
    if (j.contains("replacement")) d->replacement = j["replacement"].get<std::string>();
    const std::string scheme = j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>()
                                                            : (j.value("add_prefix_space", true) ? "always" : "never");
    d->prepend = scheme != "never";
    return d;
  }
  ZR_FAIL(where, ": decoder type '", type,
          "' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)");
}

// A byte trie for the added tokens: the longest token starting at each position, leftmost first.
struct Trie {
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;
    int32_t token = -1;  // index into the token list
  };
  std::vector<Node> nodes{1};
  std::array<bool, 256> first{};
  void add(const std::string& s, int32_t token) {
    int n = 0;
    for (unsigned char c : s) {
      int next = -1;
      for (auto& [k, v] : nodes[n].kids)
        if (k == c) next = v;
      if (next < 0) {
        next = static_cast<int>(nodes.size());
        nodes[n].kids.push_back({c, next});
        nodes.emplace_back();
      }
      n = next;
    }
    nodes[n].token = token;
    if (!s.empty()) first[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return nodes.size() == 1; }
  // The longest match at s[i..]: its length (0 if none) and token.
  size_t match(std::string_view s, size_t i, int32_t& token) const {
    if (!first[static_cast<unsigned char>(s[i])]) return 0;
    int n = 0;
    size_t best = 0;
    for (size_t k = i; k < s.size(); ++k) {
      int next = -1;
      for (auto& [c, v] : nodes[n].kids)
        if (c == static_cast<unsigned char>(s[k])) {
          next = v;
          break;
        }
      if (next < 0) break;
      n = next;
      if (nodes[n].token >= 0) best = k + 1 - i, token = nodes[n].token;
    }
    return best;
  }
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, normalized, special;
};

bool file_exists(const std::string& p) { return std::ifstream(platform::to_path(p)).good() && !is_directory(p); }

struct Section {  // a piece of text, or an added token (token >= 0)
  std::string text;
  int32_t token = -1;
};

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary + added tokens
  std::vector<std::string> id_to_tok;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  int32_t unk = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t byte_ids[256];
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;  // for the ByteLevel decoder
  std::vector<bool> special;
  Trie raw_trie, norm_trie;
  // post-processor: ids before and after the sequence (when add_special_tokens)
  std::vector<int32_t> prefix, suffix;
  bool clean_up_spaces = true;
  int32_t bos = -1, eos = -1, pad = -1;
  std::string bos_tok, eos_tok, chat_template;

  struct Cache {
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  // Word caches lent to encode() calls, one a call in flight; kept for the next call. A pool, not a thread_local
  // cache: MinGW's runtime destroys thread_local objects after freeing their storage when a thread ends (prepare's
  // worker threads crashed on Windows).
  mutable std::mutex pool_mutex;
  mutable std::vector<std::unique_ptr<Cache>> pool;

  int32_t lookup(const std::string& s) const {
    auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  }

  void bpe(const std::string& word, std::vector<int32_t>& out, Cache& cache) const {
    if (ignore_merges) {
      const int32_t id = lookup(word);
      if (id >= 0) return out.push_back(id);
    }
    if (word.size() < 256) {
      auto it = cache.words.find(word);
      if (it != cache.words.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> sym;
    sym.reserve(word.size());
    std::string ch;
    for (size_t i = 0; i < word.size();) {
      const size_t s = i;
      next_cp(word, i);
      ch.assign(word, s, i - s);
      const int32_t id = lookup(ch);
      if (id >= 0) {
        sym.push_back(id);
        continue;
      }
      bool done = false;
      if (byte_fallback) {
        done = true;
        for (size_t k = s; k < i; ++k) done = done && byte_ids[static_cast<unsigned char>(word[k])] >= 0;
        if (done)
          for (size_t k = s; k < i; ++k) sym.push_back(byte_ids[static_cast<unsigned char>(word[k])]);
      }
      if (!done && unk >= 0) {
        if (!(fuse_unk && !sym.empty() && sym.back() == unk)) sym.push_back(unk);
      }
    }
    // Merge the lowest-ranked adjacent pair, leftmost first, until none is left.
    const int n = static_cast<int>(sym.size());
    std::vector<int> prev(n), next(n);
    for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
    using Item = std::tuple<int32_t, int, int32_t, int32_t>;  // rank, left position, left id, right id
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> q;
    auto push = [&](int l) {
      if (l < 0 || next[l] < 0) return;
      const int r = next[l];
      auto it = merges.find((uint64_t(uint32_t(sym[l])) << 32) | uint32_t(sym[r]));
      if (it != merges.end()) q.push({it->second.first, l, sym[l], sym[r]});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> dead(n, false);
    while (!q.empty()) {
      auto [rank, l, a, b] = q.top();
      q.pop();
      if (dead[l] || sym[l] != a || next[l] < 0 || sym[next[l]] != b) continue;
      const int r = next[l];
      sym[l] = merges.at((uint64_t(uint32_t(a)) << 32) | uint32_t(b)).second;
      dead[r] = true;
      next[l] = next[r];
      if (next[r] >= 0) prev[next[r]] = l;
      push(prev[l]);
      push(l);
    }
    const size_t at = out.size();
    for (int i = n ? 0 : -1; i >= 0; i = next[i]) out.push_back(sym[i]);
    if (word.size() < 256) {
      if (cache.words.size() > 200000) cache.words.clear();
      cache.words.emplace(word, std::vector<int32_t>(out.begin() + static_cast<long>(at), out.end()));
    }
  }

  // Splits `text` on the added tokens of `trie`, applying lstrip/rstrip to the neighbours.
  std::vector<Section> split_added(std::string_view text, const Trie& trie) const {
    std::vector<Section> s;
    if (trie.empty()) {
      s.push_back({std::string(text), -1});
      return s;
    }
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      int32_t tok;
      const size_t len = trie.match(text, i, tok);
      if (!len) {
        ++i;
        continue;
      }
      if (i > start) s.push_back({std::string(text.substr(start, i - start)), -1});
      s.push_back({"", tok});
      i += len;
      start = i;
    }
    if (start < text.size()) s.push_back({std::string(text.substr(start)), -1});
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k].token < 0) continue;
      const AddedToken& t = added[static_cast<size_t>(s[k].token)];
      if (t.lstrip && k > 0 && s[k - 1].token < 0) s[k - 1].text = std::string(trim_end(s[k - 1].text));
      if (t.rstrip && k + 1 < s.size() && s[k + 1].token < 0) s[k + 1].text = std::string(trim_start(s[k + 1].text));
    }
    return s;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, Cache& cache) const {
    std::vector<int32_t> ids;
    if (add_special) ids = prefix;
    std::vector<Section> sections = split_added(text, raw_trie);
    Pieces pieces;
    for (size_t si = 0; si < sections.size(); ++si) {
      Section& sec = sections[si];
      if (sec.token >= 0) {
        ids.push_back(added[static_cast<size_t>(sec.token)].id);
        continue;
      }
      if (sec.text.empty()) continue;
      if (normalizer) normalizer->apply(sec.text);
      if (sec.text.empty()) continue;
      for (Section& sub : split_added(sec.text, norm_trie)) {
        if (sub.token >= 0) {
          ids.push_back(added[static_cast<size_t>(sub.token)].id);
          continue;
        }
        if (sub.text.empty()) continue;
        pieces.clear();
        pieces.push_back(std::move(sub.text));
        if (pre) pre->apply(pieces, si);
        for (auto& p : pieces)
          if (!p.empty()) bpe(p, ids, cache);
      }
    }
    if (add_special) ids.insert(ids.end(), suffix.begin(), suffix.end());
    return ids;
  }
};

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZR_FAIL(source, ": not valid JSON: ", e.what());
  }
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.source = source;
  try {
    ZR_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "no 'model' object");
    const json& m = j["model"];
    const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
    ZR_CHECK(type == "BPE", "model.type '", type,
             "' is not supported (only BPE: byte-level like GPT-2/Llama 3/Qwen, or SentencePiece-style with byte "
             "fallback like Llama 2/Mistral/Gemma)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      ZR_CHECK(!m.contains(k) || m[k].is_null() || m[k].get<std::string>().empty(), "model.", k, " is not supported");
    ZR_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0,
             "model.dropout is not supported (BPE dropout is for training a tokenizer)");
    ZR_CHECK(m.contains("vocab") && m["vocab"].is_object(), "model.vocab must be an object {token: id}");
    int32_t max_id = -1;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      const int32_t id = it.value().get<int32_t>();
      ZR_CHECK(id >= 0, "model.vocab['", it.key(), "'] has a negative id");
      t.vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    t.byte_fallback = m.value("byte_fallback", false);
    t.fuse_unk = m.value("fuse_unk", false);
    t.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) t.unk = t.lookup(m["unk_token"].get<std::string>());
    const json& merges = m.at("merges");
    ZR_CHECK(merges.is_array(), "model.merges must be an array");
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string a, b;
      if (merges[r].is_string()) {
        const std::string s = merges[r].get<std::string>();
        const size_t sp = s.find(' ');
        ZR_CHECK(sp != std::string::npos, "model.merges[", r, "] '", s, "' is not two tokens separated by a space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        ZR_CHECK(merges[r].is_array() && merges[r].size() == 2, "model.merges[", r, "] must be \"a b\" or [a, b]");
        a = merges[r][0].get<std::string>();
        b = merges[r][1].get<std::string>();
      }
      const int32_t ia = t.lookup(a), ib = t.lookup(b), im = t.lookup(a + b);
      ZR_CHECK(ia >= 0 && ib >= 0 && im >= 0, "model.merges[", r, "] ('", a, "', '", b,
               "'): a part or the merged token is not in model.vocab");
      t.merges.emplace((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib), std::make_pair(int32_t(r), im));
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      t.byte_ids[b] = t.lookup(name);
    }
    t.normalizer = make_normalizer(j.value("normalizer", json()), "normalizer");
    t.pre = make_pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer");
    if (j.contains("added_tokens")) {
      for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
        const json& a = j["added_tokens"][i];
        AddedToken tok;
        tok.content = a.at("content").get<std::string>();
        tok.id = a.at("id").get<int32_t>();
        tok.special = a.value("special", false);
        tok.lstrip = a.value("lstrip", false);
        tok.rstrip = a.value("rstrip", false);
        tok.normalized = a.value("normalized", !tok.special);
        ZR_CHECK(!tok.content.empty() && tok.id >= 0, "added_tokens[", i, "]: empty content or negative id");
        t.vocab[tok.content] = tok.id;
        t.added_by_content[tok.content] = tok.id;
        max_id = std::max(max_id, tok.id);
        t.added.push_back(tok);
      }
    }
    t.id_to_tok.assign(static_cast<size_t>(max_id + 1), "");
    t.special.assign(static_cast<size_t>(max_id + 1), false);
    for (auto& [s, id] : t.vocab) t.id_to_tok[static_cast<size_t>(id)] = s;
    for (size_t i = 0; i < t.added.size(); ++i) {
      AddedToken& a = t.added[i];
      t.id_to_tok[static_cast<size_t>(a.id)] = a.content;
      t.special[static_cast<size_t>(a.id)] = a.special;
      if (a.normalized && t.normalizer) {
        std::string n = a.content;
        t.normalizer->apply(n);
        if (!n.empty()) t.norm_trie.add(n, static_cast<int32_t>(i));
      } else {
        t.raw_trie.add(a.content, static_cast<int32_t>(i));
      }
    }
    t.decoder = make_decoder(j.value("decoder", json()), "decoder", &t.added_by_content);
    // Post-processor: the ids a single sequence gets around it.
    std::function<void(const json&, const std::string&)> post = [&](const json& p, const std::string& where) {
      if (p.is_null()) return;
      const std::string pt = p.value("type", "");
      if (pt == "Sequence") {
        for (size_t i = 0; i < p.at("processors").size(); ++i)
          post(p["processors"][i], where + ".processors[" + std::to_string(i) + "]");
      } else if (pt == "ByteLevel") {
      } else if (pt == "TemplateProcessing") {
        bool after = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          const std::string sid = item.at("SpecialToken").at("id").get<std::string>();
          const json& st = p.at("special_tokens");
          ZR_CHECK(st.contains(sid), where, ": template token '", sid, "' is not in special_tokens");
          for (const json& id : st[sid].at("ids")) (after ? t.suffix : t.prefix).push_back(id.get<int32_t>());
        }
      } else if (pt == "RobertaProcessing" || pt == "BertProcessing") {
        t.prefix.push_back(p.at("cls")[1].get<int32_t>());
        t.suffix.push_back(p.at("sep")[1].get<int32_t>());
      } else {
        ZR_FAIL(where, ": post-processor type '", pt,
                "' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, "
                "Sequence)");
      }
    };
    post(j.value("post_processor", json()), "post_processor");
  } catch (const Error& e) {
    throw e.with_context(source);
  } catch (const json::exception& e) {
    ZR_FAIL(source, ": ", e.what());
  }
  Tokenizer tk;
  tk.impl_ = impl;
  return tk;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::string dir, file = path;
  if (is_directory(path)) {
    dir = path;
    file = path + "/tokenizer.json";
    ZR_CHECK(file_exists(file), path, ": no tokenizer.json in this directory");
  } else {
    const size_t slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  Tokenizer tk = from_json(read_file(file), file);
  auto impl = std::const_pointer_cast<Impl>(tk.impl_);
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (file_exists(cfg_path)) {
    json c;
    try {
      c = json::parse(read_file(cfg_path));
    } catch (const json::exception& e) {
      ZR_FAIL(cfg_path, ": not valid JSON: ", e.what());
    }
    if (c.contains("bos_token")) impl->bos_tok = str_or_content(c["bos_token"]);
    if (c.contains("eos_token")) impl->eos_tok = str_or_content(c["eos_token"]);
    if (c.contains("pad_token")) impl->pad = impl->lookup(str_or_content(c["pad_token"]));
    impl->bos = impl->bos_tok.empty() ? -1 : impl->lookup(impl->bos_tok);
    impl->eos = impl->eos_tok.empty() ? -1 : impl->lookup(impl->eos_tok);
    if (c.contains("clean_up_tokenization_spaces") && c["clean_up_tokenization_spaces"].is_boolean())
      impl->clean_up_spaces = c["clean_up_tokenization_spaces"].get<bool>();
    if (c.contains("chat_template")) {
      const json& ct = c["chat_template"];
      if (ct.is_string()) {
        impl->chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const json& e : ct)
          if (e.value("name", "") == "default") impl->chat_template = e.value("template", "");
      }
    }
  }
  if (file_exists(dir + "/chat_template.jinja")) impl->chat_template = read_file(dir + "/chat_template.jinja");
  return tk;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // A word cache borrowed from the tokenizer's pool for this call (a new one when every cache is lent out).
  std::unique_ptr<Impl::Cache> cache;
  {
    std::lock_guard<std::mutex> lock(impl_->pool_mutex);
    if (!impl_->pool.empty()) {
      cache = std::move(impl_->pool.back());
      impl_->pool.pop_back();
    }
  }
  if (!cache) cache = std::make_unique<Impl::Cache>();
  struct Return {  // back to the pool also when encoding throws
    const Impl& t;
    std::unique_ptr<Impl::Cache>& c;
    ~Return() {
      std::lock_guard<std::mutex> lock(t.pool_mutex);
      t.pool.push_back(std::move(c));
    }
  } back{*impl_, cache};
  return impl_->encode(text, add_special_tokens, *cache);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens, int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(1, texts.size())));
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto work = [&] {
    Impl::Cache cache;
    try {
      for (size_t i; (i = next.fetch_add(1)) < texts.size();)
        out[i] = impl_->encode(texts[i], add_special_tokens, cache);
    } catch (...) {
      std::lock_guard<std::mutex> g(err_mu);
      err = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens, bool clean_up_spaces) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  for (int32_t id : ids) {
    // An id the tokenizer has no token for (a model's padded vocabulary: Qwen2.5's 151936 rows for 151665 tokens)
    // decodes to nothing, as in HF tokenizers; `zerorun sample` says so when it generates one.
    if (id < 0 || static_cast<size_t>(id) >= t.id_to_tok.size()) continue;
    if (skip_special_tokens && t.special[static_cast<size_t>(id)]) continue;
    toks.push_back(t.id_to_tok[static_cast<size_t>(id)]);
  }
  std::string s;
  if (t.decoder) {
    t.decoder->apply(toks);
    for (auto& x : toks) s += x;
  } else {
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
  }
  if (t.clean_up_spaces && clean_up_spaces) {
    for (auto [a, b] : std::initializer_list<std::pair<const char*, const char*>>{{" .", "."},
                                                                                  {" ?", "?"},
                                                                                  {" !", "!"},
                                                                                  {" ,", ","},
                                                                                  {" ' ", "'"},
                                                                                  {" n't", "n't"},
                                                                                  {" 'm", "'m"},
                                                                                  {" 's", "'s"},
                                                                                  {" 've", "'ve"},
                                                                                  {" 're", "'re"}})
      replace_all(s, a, b);
  }
  return s;
}

std::string DecodeStream::push(int32_t id) {
  ids_.push_back(id);
  const std::vector<int32_t> done(ids_.begin() + static_cast<long>(prefix_), ids_.begin() + static_cast<long>(read_));
  const std::vector<int32_t> all(ids_.begin() + static_cast<long>(prefix_), ids_.end());
  const std::string before = done.empty() ? "" : t_.decode(done, skip_, false);
  const std::string now = t_.decode(all, skip_, false);
  // Hold back while the text ends in an incomplete character (decoded as U+FFFD).
  if (now.size() <= before.size() || (now.size() >= 3 && now.compare(now.size() - 3, 3, "\xEF\xBF\xBD") == 0))
    return "";
  prefix_ = read_;
  read_ = ids_.size();
  return now.substr(before.size());
}

int32_t Tokenizer::token_to_id(const std::string& token) const { return impl_->lookup(token); }
std::string Tokenizer::id_to_token(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_to_tok.size() ? impl_->id_to_tok[static_cast<size_t>(id)] : "";
}
int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_tok.size()); }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[static_cast<size_t>(id)];
}
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
std::string Tokenizer::bos_token() const { return impl_->bos_tok; }
std::string Tokenizer::eos_token() const { return impl_->eos_tok; }
std::string Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace zerorun
