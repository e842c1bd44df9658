// Training data: llm.c token shards (int32[256] header, magic 20240520,
// version 1, count, then uint16 tokens), .npy uint16/uint32 token arrays,
// and synthetic tasks. Sample s of the global order is fixed, so any world
// size sees the same global batches; each rank takes its own slice.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/graph.h"
#include "zerorun/model.h"

namespace zerorun {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Inputs for global samples [first, first + count).
  virtual std::map<std::string, Tensor> batch(int64_t first, int64_t count) = 0;
  virtual std::string describe() const = 0;
  virtual int64_t tokens_per_sample() const { return 1; }
  // Whether "targets" may hold -100 (ignored by the loss): the engine then weighs micro-batches by counted targets.
  virtual bool may_ignore_targets() const { return false; }
  // What the samples are, for comparing ranks (rank_agreement.h): by default the description.
  virtual uint64_t fingerprint() const;
};

// Reads every token of the listed files (glob patterns, comma separated).
std::vector<uint32_t> load_token_files(const std::string& spec, std::vector<std::string>* files = nullptr);
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// zerorun's token shard (written by `zerorun prepare`; load_token_files reads it beside llm.c shards).
// Little-endian; a header of 256 int32 words, then the sections in this order:
//   header[0] = 20250711 (magic), [1] = 1 (version), [2..3] = token count (int64, low word first),
//   [4] = bytes a token (2: uint16, 4: uint32), [5..6] = document count (int64), [7] = flags (bit 0: a loss
//   mask follows), [8] = vocabulary size (0: unknown), the rest 0;
//   tokens (count x width bytes);
//   loss mask (count bytes, when flags bit 0): 1 where the token is a target of the loss (transformers' labels
//     not -100: the token is predicted from the ones before it), 0 where it is context only (a prompt, a
//     user turn, a template's markup, and the first token of every document);
//   document starts (document count + 1 int64 token offsets: where each document begins, then the count).
constexpr int32_t kZerorunShardMagic = 20250711;
struct TokenShard {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> loss_mask;   // empty: every token is a target
  std::vector<int64_t> doc_starts;  // document d is [doc_starts[d], doc_starts[d + 1]); empty: one document
  int64_t vocab_size = 0;
};
// Reads an llm.c shard or a zerorun shard (errors name the file and what is wrong).
TokenShard read_token_shard(const std::string& path);
void write_zerorun_shard(const std::string& path, const TokenShard& shard);
// Every shard of `spec` (glob patterns, comma separated; llm.c or zerorun) concatenated in order: document starts
// offset into the whole, the loss mask filled with 1 for shards without one (empty if no shard has one).
TokenShard load_token_shards(const std::string& spec, std::vector<std::string>* files = nullptr);

// Windows of seq_len tokens over load_token_shards(spec), as the token-file source cuts them (documents packed),
// with what the loss mask and document boundaries need: "tokens" and "targets" [B, T] i32 with targets =
// ignore_index where the target token's mask is 0 or it starts a document, and "positions" [B, T] i32, each token's
// position in its document (0 where a document starts, and at the window's start: a document that began in an
// earlier window continues from 0, so positions stay below T), which graphs with the optional "positions" input give to
// rope, the learned position table and attention (no attention across documents). `per_document` false (a graph
// without that input) only changes what describe() says: that attention crosses the documents.
std::unique_ptr<DataSource> make_masked_token_source(const std::string& spec, int64_t seq_len, int64_t vocab,
                                                     int32_t ignore_index = -100, bool per_document = true);

// One document a sequence (the alternative to packing: no attention across documents without per-document
// attention kernels): sample s is document s mod the document count, cut to seq_len + 1 tokens, "tokens" padded
// with pad_id, "targets" = ignore_index past its end and where the mask is 0, "positions" 0..T-1.
std::unique_ptr<DataSource> make_padded_document_source(const std::string& spec, int64_t seq_len, int64_t vocab,
                                                        int32_t pad_id, int32_t ignore_index = -100);

// `zerorun prepare`: text files and JSONL ({"text"}, {"messages": [{role, content}]}, {"prompt", "completion"})
// to token shards, tokenized with a transformers tokenizer.json, chat rendered with the model's template.
struct PrepareOptions {
  std::vector<std::string> inputs;       // files or glob patterns: *.jsonl / *.json lines, anything else is text
  std::string tokenizer;                 // tokenizer.json or a directory with it (+ tokenizer_config.json)
  std::string out = "data";              // shards are <out>_000000.bin, ...; <out>_val_000000.bin with val_docs
  std::string format = "zerorun";        // zerorun | llmc (uint16 tokens, no mask or document boundaries)
  std::string chat_template;             // a .jinja file overriding the tokenizer's template
  std::string train_on = "completions";  // completions (assistant turns / completion / all text) | all
  bool eos = true;                       // end each text / prompt-completion document with the EOS token
  int64_t shard_tokens = 100000000;
  int64_t val_docs = 0;  // the first N documents go to the validation shards
  int threads = 0;       // 0: every core
  bool progress = true;
};
struct PrepareResult {
  int64_t documents = 0, tokens = 0, target_tokens = 0, bytes_in = 0;
  std::vector<std::string> shards;
  double seconds = 0;
};
PrepareResult prepare_data(const PrepareOptions& o);

// Picks a source for the model: token files for token models, "synthetic"
// (or empty) for the built-in synthetic task matching the graph inputs. Token files with a loss mask or documents
// (zerorun shards) are packed (make_masked_token_source), or with packing false one document a sequence
// (make_padded_document_source, padded with the token table's padding_idx, else 0).
std::unique_ptr<DataSource> make_data_source(const std::string& spec, const Model& m, int64_t seq_len, uint64_t seed,
                                             bool packing = true);

}  // namespace zerorun
