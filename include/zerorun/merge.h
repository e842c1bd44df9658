// `zerorun merge`: ZeRO shards -> full weights (see src/checkpoint/merge.cc).
#pragma once
#include <cstdint>
#include <string>

#include "zerorun/dtype.h"

namespace zerorun {

struct MergeResult {
  std::string dir, safetensors, model_bin, config_json;
  int64_t params = 0, largest = 0, peak_rss_bytes = 0, baseline_rss_bytes = 0;  // RSS: peak, and at the start
};

MergeResult merge_checkpoint(const std::string& ckpt, const std::string& tag, const std::string& out_dir, DType dtype);

}  // namespace zerorun
