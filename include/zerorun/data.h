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
  // What the samples are, for comparing ranks (rank_agreement.h): by default the description.
  virtual uint64_t fingerprint() const;
};

// Reads every token of the listed files (glob patterns, comma separated).
std::vector<uint32_t> load_token_files(const std::string& spec, std::vector<std::string>* files = nullptr);
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Picks a source for the model: token files for token models, "synthetic"
// (or empty) for the built-in synthetic task matching the graph inputs.
std::unique_ptr<DataSource> make_data_source(const std::string& spec, const Model& m, int64_t seq_len, uint64_t seed);

}  // namespace zerorun
