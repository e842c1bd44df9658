// `zerorun sample` (alias `generate`): text from a trained model without Python. A model.bin, a checkpoint
// (save_dir or global_step<N>: merged in a temporary directory first), or a transformers directory (merged or
// downloaded) + its tokenizer.json; greedy decoding or sampling (temperature, top-k, top-p, seeded) with a
// key/value cache: the prompt runs once, then each new token runs alone through the graph, its attention reading
// the cached keys and values of the tokens before it (rope at its own position), on the CPU or a GPU through the
// Backend ops (src/infer/).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/model.h"
#include "zerorun/rng.h"

namespace zerorun {

// Runs a decoder graph (the graphs zerorun builds and imports: token embedding, learned or rotary positions,
// attention with any AttnDims option, any other op) one chunk of tokens at a time over a key/value cache per
// attention node. Positions continue from the tokens fed before.
class Decoder {
 public:
  // The model's weights are copied to `dev`; the cache holds `capacity` tokens.
  Decoder(const Model& m, Device dev, int64_t capacity);
  ~Decoder();
  // Appends `ids` (at positions length() .. length() + n - 1) and returns the logits of the last one [vocab()], or
  // with `all` the logits of every one [n x vocab()].
  std::vector<float> feed(const std::vector<int32_t>& ids, bool all = false);
  void reset();  // an empty cache
  int64_t length() const { return len_; }
  int64_t capacity() const { return cap_; }
  int64_t vocab() const { return vocab_; }
  // The most positions the model has (its position table's rows, else the graph's T symbol), 0 if unbounded.
  int64_t max_positions() const { return max_pos_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t len_ = 0, cap_ = 0, vocab_ = 0, max_pos_ = 0;
};

// How the next token is chosen, in transformers' order: logits / temperature, then the top_k largest, then the
// smallest set whose probability reaches top_p; then a draw. temperature 0: greedy (the first largest logit).
struct Sampling {
  double temperature = 0.0;
  int64_t top_k = 0;   // 0: all
  double top_p = 1.0;  // 1: all
};
int32_t pick_token(const float* logits, int64_t V, const Sampling& s, Rng& rng);

// Generates up to max_new tokens after `prompt` (fed to d, which must be empty), stopping after any of `eos`;
// on_token is called with each new token as it is chosen. Returns the new tokens.
std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t max_new, const Sampling& s,
                              uint64_t seed, const std::vector<int32_t>& eos,
                              const std::function<void(int32_t)>& on_token = nullptr);

struct SampleOptions {
  std::string model;      // model.bin, a checkpoint (save_dir / global_step<N>), or a transformers directory
  std::string tokenizer;  // tokenizer.json or its directory ("": the model's directory, or its import's)
  std::string prompt;
  std::vector<int32_t> prompt_ids;  // token ids instead of text (no tokenizer needed with `ids`)
  bool chat = false;                // render [{"role": "user", "content": prompt}] with the chat template
  std::string system;               // a system message first (chat)
  std::string chat_template;        // a .jinja file instead of the tokenizer's template
  int64_t max_new_tokens = 128;
  Sampling sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;      // generate max_new_tokens whatever comes
  bool ids = false;             // print the new token ids (one line) instead of text
  std::string device = "auto";  // auto | cpu | cuda
  bool quiet = false;           // no statistics line on stderr
};
// Prints the generated text (streamed) or ids to stdout; returns the exit code.
int run_sample(const SampleOptions& o);

}  // namespace zerorun
