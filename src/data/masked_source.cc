// Token windows carrying the loss mask (targets = ignore_index) and per-document positions, or one padded document a
// sequence (data.h).
#include <algorithm>

#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/hash.h"

namespace zerorun {
namespace {

class MaskedTokenWindows : public DataSource {
 public:
  MaskedTokenWindows(TokenShard s, int64_t T, int64_t vocab, int32_t ignore, std::string desc, bool per_doc)
      : s_(std::move(s)), T_(T), ignore_(ignore), desc_(std::move(desc)), per_doc_(per_doc) {
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
      // The next document start after the window's first token. A document begun in an earlier window counts from
      // this window's start (position 0), as a window cut from unmarked text does: positions stay below T (a learned
      // position table of n_ctx rows holds them) and the earlier tokens are not in this window to attend to.
      auto it = std::upper_bound(s_.doc_starts.begin(), s_.doc_starts.end(), base);
      int64_t doc_start = base;
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
  bool may_ignore_targets() const override { return true; }
  std::string describe() const override {
    return desc_ + " (" + std::to_string(s_.tokens.size()) + " tokens, " + std::to_string(s_.doc_starts.size() - 1) +
           " documents packed into " + std::to_string(windows_) + " sequences of " + std::to_string(T_) +
           (per_doc_ ? ", attention and positions per document)"
                     : "; attention crosses documents: the model's graph has no 'positions' input, re-create it with "
                       "zerorun init or import)");
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
  bool per_doc_;
};

class PaddedDocuments : public DataSource {
 public:
  PaddedDocuments(TokenShard s, int64_t T, int64_t vocab, int32_t pad, int32_t ignore, std::string desc)
      : s_(std::move(s)), T_(T), pad_(pad), ignore_(ignore), desc_(std::move(desc)) {
    if (s_.doc_starts.empty()) s_.doc_starts = {0, static_cast<int64_t>(s_.tokens.size())};
    ZR_CHECK(s_.doc_starts.size() >= 2, desc_, ": no documents");
    ZR_CHECK(pad >= 0 && pad < vocab, desc_, ": the padding id ", pad, " is outside the model's vocabulary of ", vocab);
    for (size_t i = 0; i < s_.tokens.size(); ++i)
      ZR_CHECK(s_.tokens[i] < static_cast<uint64_t>(vocab), desc_, ": token ", s_.tokens[i], " at index ", i,
               " is outside the model's vocabulary of ", vocab);
  }
  std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
    Tensor x = Tensor::empty({count, T_}, DType::I32), y = Tensor::empty({count, T_}, DType::I32),
           p = Tensor::empty({count, T_}, DType::I32);
    const int64_t docs = static_cast<int64_t>(s_.doc_starts.size()) - 1;
    for (int64_t b = 0; b < count; ++b) {
      const int64_t d = (first + b) % docs, start = s_.doc_starts[static_cast<size_t>(d)];
      const int64_t len = std::min(s_.doc_starts[static_cast<size_t>(d) + 1] - start, T_ + 1);
      for (int64_t t = 0; t < T_; ++t) {
        const size_t i = static_cast<size_t>(start + t);
        x.i32()[b * T_ + t] = t < len ? static_cast<int32_t>(s_.tokens[i]) : pad_;
        const bool target = t + 1 < len && (s_.loss_mask.empty() || s_.loss_mask[i + 1]);
        y.i32()[b * T_ + t] = target ? static_cast<int32_t>(s_.tokens[i + 1]) : ignore_;
        p.i32()[b * T_ + t] = static_cast<int32_t>(t);
      }
    }
    return {{"tokens", x}, {"targets", y}, {"positions", p}};
  }
  bool may_ignore_targets() const override { return true; }
  std::string describe() const override {
    return desc_ + " (" + std::to_string(s_.doc_starts.size() - 1) + " documents, one a sequence of " +
           std::to_string(T_) + ", padded)";
  }
  uint64_t fingerprint() const override {
    uint64_t h = fnv1a(&T_, sizeof T_);
    for (size_t d = 0; d < s_.doc_starts.size(); d += 7) h = fnv1a(&s_.doc_starts[d], sizeof(int64_t), h);
    for (size_t i = 0; i < s_.tokens.size(); i += 61) h = fnv1a(&s_.tokens[i], sizeof s_.tokens[i], h);
    return h;
  }
  int64_t tokens_per_sample() const override { return T_; }

 private:
  TokenShard s_;
  int64_t T_;
  int32_t pad_, ignore_;
  std::string desc_;
};

}  // namespace

std::unique_ptr<DataSource> make_padded_document_source(const std::string& spec, int64_t seq_len, int64_t vocab,
                                                        int32_t pad_id, int32_t ignore_index) {
  std::vector<std::string> files;
  TokenShard s = load_token_shards(spec, &files);
  const std::string desc = files.size() == 1 ? files[0] : std::to_string(files.size()) + " files matching " + spec;
  return std::make_unique<PaddedDocuments>(std::move(s), seq_len, vocab, pad_id, ignore_index, desc);
}

std::unique_ptr<DataSource> make_masked_token_source(const std::string& spec, int64_t seq_len, int64_t vocab,
                                                     int32_t ignore_index, bool per_document) {
  std::vector<std::string> files;
  TokenShard s = load_token_shards(spec, &files);
  const std::string desc = files.size() == 1 ? files[0] : std::to_string(files.size()) + " files matching " + spec;
  return std::make_unique<MaskedTokenWindows>(std::move(s), seq_len, vocab, ignore_index, desc, per_document);
}

}  // namespace zerorun
