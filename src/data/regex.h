// A small backtracking regex engine over code points for the tokenizers' pre-tokenizer patterns (src/data only).
// Syntax (Oniguruma / Rust regex, as tokenizer.json files write it): alternation, groups (...), (?:...),
// (?i:...) (ASCII case folding), lookahead (?=...) (?!...), quantifiers ? * + {n} {n,} {n,m} (greedy, or lazy with
// a trailing ?), '.', classes [...] with ranges and negation, escapes \s \S \d \D \w \W \p{..} \P{..} (general
// categories: L, Lu, N, Nd, P, S, M, Z, C, ... and their long names), \r \n \t \f \v \0 \xHH \x{H..} \uHHHH, ^ and $.
// Semantics are leftmost-first like both engines: the first alternative that matches wins.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zerorun {

class Regex {
 public:
  // Throws zerorun::Error naming the pattern and the offset at fault.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  // Non-overlapping leftmost-first matches as [begin, end) code point offsets; empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> find_all(const std::vector<uint32_t>& text) const;
  const std::string& pattern() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerorun
