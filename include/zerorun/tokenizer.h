// Tokenizers from transformers' tokenizer.json, without Python: byte-level BPE (GPT-2, Llama 3, Qwen2.5/3) and
// SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama, Gemma), with the pipeline transformers
// runs: added/special tokens split out first (lstrip/rstrip/normalized), normalizers (NFC, NFD, Prepend, Replace,
// Strip, Sequence), pre-tokenizers (Split with a regex or string and every behaviour, ByteLevel, Metaspace,
// Whitespace, WhitespaceSplit, Digits, Sequence), the BPE model (merges, ignore_merges, byte_fallback, fuse_unk,
// unk), post-processors (TemplateProcessing, ByteLevel, Roberta/Bert, Sequence) and decoders (ByteLevel,
// Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence). Checked id for id against transformers.js on real
// tokenizer.json files (tests/data/tokenizer_oracle.sh).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zerorun {

class Tokenizer {
 public:
  // `path` is a tokenizer.json, or a directory holding one (and, optionally, tokenizer_config.json, whose
  // bos/eos/pad tokens and chat_template are read; chat_template.jinja beside it wins).
  static Tokenizer load(const std::string& path);
  // From the text of a tokenizer.json; `source` names it in errors.
  static Tokenizer from_json(const std::string& json_text, const std::string& source = "tokenizer.json");

  // Token ids of `text` (UTF-8). add_special_tokens runs the post-processor (e.g. a leading <s>).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Many documents on `threads` threads (0: all cores); the result is the same as encode() one by one.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true,
                                                 int threads = 0) const;
  // The decoder's text; then transformers' clean_up_tokenization_spaces (" ." -> ".", ...) when
  // tokenizer_config.json asks for it (transformers.js's default) and `clean_up_spaces` allows it.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false,
                     bool clean_up_spaces = true) const;

  int32_t token_to_id(const std::string& token) const;  // -1 when absent
  std::string id_to_token(int32_t id) const;            // "" when absent
  int64_t vocab_size() const;                           // the largest id + 1, added tokens included
  bool is_special(int32_t id) const;

  // From tokenizer_config.json when present (-1 / "" otherwise).
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  std::string bos_token() const;
  std::string eos_token() const;
  std::string chat_template() const;
  const std::string& source() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Text as tokens arrive (sampling): push() returns what the new token adds ("" while a UTF-8 character is still
// incomplete), so the pieces concatenate to decode(ids, skip, false) (no space clean-up, which needs the whole
// text). Decodes a short window, as HF tokenizers' DecodeStream.
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& t, bool skip_special_tokens = false) : t_(t), skip_(skip_special_tokens) {}
  std::string push(int32_t id);

 private:
  const Tokenizer& t_;
  bool skip_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;
};

// Learns a byte-level BPE tokenizer (GPT-2's scheme: its pre-tokenizer regex, the 256 byte symbols, then merges
// of the most frequent adjacent pair, ties to the smaller pair) from text files (JSONL: the "text" of each line)
// and writes `out_dir`/tokenizer.json + tokenizer_config.json that zerorun, transformers and transformers.js load.
// `special` tokens (the first is BOS/EOS/UNK) take the first ids. Returns the vocabulary size reached.
struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // files or glob patterns
  std::string out_dir;
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;
  std::vector<std::string> special = {"<|endoftext|>"};
};
int64_t train_bpe_tokenizer(const TokenizerTrainOptions& o);

}  // namespace zerorun
