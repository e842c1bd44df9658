// Token windows carrying the loss mask (targets = ignore_index) and per-document positions (data.h).
#include <algorithm>

#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/rank_agreement.h"

namespace zerorun {
namespace {

class MaskedTokenWindows : public DataSource {
 public:
  MaskedTokenWindows(TokenShard s, int64_t T, int64_t vocab, int32_t ignore, std::string desc)
      : s_(std::move(s)), T_(T), ignore_(ignore), desc_(std::move(desc)) {
    ZR_CHECK(static_cast<int64_t>(s_.tokens.size()) >= T + 1, desc_, ": ", s_.tokens.size(),
             " tokens is fewer than one sequence of ", T + 1);
    for (size_t i = 0; i < s_.tokens.size(); ++i)
      ZR_CHECK(s_.tokens[i] < static_cast<uint64_t>(vocab), desc_, ": token ", s_.tokens[i], " at index ", i,
               " is outside the model's vocabulary of ", vocab);
    windows_ = (static_cast<int64_t>(s_.tokens.size()) - 1) / T;
  }
  std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
    Tensor x = Tensor::empty({count, T_}, DType::I32), y = Tensor::empty({count, T_}, DType::I32),
           p = Tensor::empty({count, T_}, DType::I32);
    for (int64_t b = 0; b < count; ++b) {
      const int64_t w = (first + b) % windows_, base = w * T_;
      // The document holding the window's first token.
      auto it = std::upper_bound(s_.doc_starts.begin(), s_.doc_starts.end(), base);
      int64_t doc_start = *(it - 1);
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t i = base + t;
        while (it != s_.doc_starts.end() && *it <= i) doc_start = *it++;
        x.i32()[b * T_ + t] = static_cast<int32_t>(s_.tokens[static_cast<size_t>(i)]);
        // No target across documents: the first token of a document is not predicted from the one before.
        const bool target = (s_.loss_mask.empty() || s_.loss_mask[static_cast<size_t>(i + 1)]) &&
                            !(it != s_.doc_starts.end() && *it == i + 1);
        y.i32()[b * T_ + t] = target ? static_cast<int32_t>(s_.tokens[static_cast<size_t>(i + 1)]) : ignore_;
        p.i32()[b * T_ + t] = static_cast<int32_t>(i - doc_start);
      }
    }
    return {{"tokens", x}, {"targets", y}, {"positions", p}};
  }
  std::string describe() const override {
    return desc_ + " (" + std::to_string(s_.tokens.size()) + " tokens, " + std::to_string(s_.doc_starts.size() - 1) +
           " documents, " + std::to_string(windows_) + " sequences of " + std::to_string(T_) + ")";
  }
  uint64_t fingerprint() const override {
    uint64_t h = fnv1a(&T_, sizeof T_);
    const uint64_t n = s_.tokens.size();
    h = fnv1a(&n, sizeof n, h);
    for (size_t i = 0; i < s_.tokens.size(); i += 61) {
      h = fnv1a(&s_.tokens[i], sizeof s_.tokens[i], h);
      if (!s_.loss_mask.empty()) h = fnv1a(&s_.loss_mask[i], 1, h);
    }
    return h;
  }
  int64_t tokens_per_sample() const override { return T_; }

 private:
  TokenShard s_;
  int64_t T_, windows_ = 0;
  int32_t ignore_;
  std::string desc_;
};

}  // namespace

std::unique_ptr<DataSource> make_masked_token_source(const std::string& spec, int64_t seq_len, int64_t vocab,
                                                     int32_t ignore_index) {
  std::vector<std::string> files;
  TokenShard s = load_token_shards(spec, &files);
  const std::string desc = files.size() == 1 ? files[0] : std::to_string(files.size()) + " files matching " + spec;
  return std::make_unique<MaskedTokenWindows>(std::move(s), seq_len, vocab, ignore_index, desc);
}

}  // namespace zerorun
