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
  std::optional<std::string> data, save_dir, log_dir, eval_data;
  std::optional<int64_t> eval_interval, eval_batches;
  bool eval_only = false;  // `zerorun eval`: set up (and --resume) as for training, evaluate once, no step
  std::string final_weights;
  std::string resume;  // "latest", a tag in save_dir, or a checkpoint directory  // write the trained fp32 weights
                       // (safetensors) here
  // "cpu", "cuda", or "auto" (the default): cuda when every rank sees a GPU, cpu when none does (and this zerorun
  // may be built without CUDA); ranks that disagree are an error. make_train_comm resolves it in place.
  std::string device = "auto";
  std::string device_note;  // how "auto" was resolved, for the log
  // Collectives on GPU buffers with several ranks: "" or "nccl" (NCCL, one GPU per rank) or "mpi" (staged through
  // host memory over MPI; ranks may share a GPU).
  std::string comm;
};

// This process's rank on its node (from the MPI launcher's environment).
int local_rank();
// This process's rank in the job, from the launcher's environment (0 when not started by one): for messages
// written before (or without) a communicator.
int launcher_rank();
// The GPU this rank trains on: its local rank (NCCL), or that modulo the GPUs visible with --comm mpi.
int gpu_for_rank(const TrainOptions& o);
// This process's communicator: MPI under an MPI launcher (NCCL or host-staged MPI for GPU buffers), else one rank.
// Resolves o.device "auto" (agreed by all ranks) and selects this rank's GPU first when it trains on one.
std::unique_ptr<Communicator> make_train_comm(TrainOptions& o);
// Returns the process exit code (0 on success); throws Error on bad input.
int run_training(const TrainOptions& o, Communicator& comm);

}  // namespace zerorun
