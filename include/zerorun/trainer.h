// One rank's whole training run (what `zerorun train` does): load config and
// model, apply command-line overrides, resolve, train, log.
#pragma once
#include <optional>
#include <string>

#include "zerorun/comm.h"

namespace zerorun {

struct TrainOptions {
  std::string model_path, config_path;
  std::optional<int64_t> steps, micro_batch, seq_len;
  std::optional<uint64_t> seed;
  std::optional<std::string> data, save_dir, log_dir;
  std::string final_weights;
  std::string resume;  // "latest", a tag in save_dir, or a checkpoint directory  // write the trained fp32 weights
                       // (safetensors) here
  std::string device = "cpu";
};

// This process's rank on its node (from the MPI launcher's environment).
int local_rank();
// Returns the process exit code (0 on success); throws Error on bad input.
int run_training(const TrainOptions& o, Communicator& comm);

}  // namespace zerorun
