// DeepSpeed-format JSON config -> typed structs. Config files are read as DeepSpeed reads them (hjson: comments,
// trailing commas, a BOM). Parsing checks keys and types: unknown top-level keys are warnings with a suggestion
// (DeepSpeed ignores them), unknown keys inside a block are errors with a suggestion (DeepSpeed's blocks forbid
// extras), known-but-unimplemented DeepSpeed keys are warnings; DeepSpeed's aliases and legacy spellings are
// mapped. resolve() applies DeepSpeed's batch rule and zerorun's "auto" rules once the world size and model are
// known, each "auto" noted with the value chosen and why.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "zerorun/aio_config.h"
#include "zerorun/dtype.h"
#include "zerorun/memory.h"

namespace zerorun {

struct OptimizerConfig {
  std::string type = "AdamW";  // Adam, AdamW, SGD
  bool given = false;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool adam_w_mode = true, bias_correction = true;
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};

struct SchedulerConfig {
  std::string type;  // empty = constant lr
  nlohmann::json params = nlohmann::json::object();
};

struct LossScaleConfig {
  double loss_scale = 0.0;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct OffloadConfig {
  std::string device = "none";  // none | cpu | nvme (offload_optimizer only)
  bool pin_memory = false;
  // device "nvme": the directory on the NVMe disk; buffer_count chunk buffers of the optimizer's stream
  // (offload_optimizer: DeepSpeed's default 4); buffer_size elements a chunk (offload_param's key, DeepSpeed's
  // 1e8; the optimizer's chunks default to 16M elements); pipeline_read / pipeline_write: read ahead, write behind.
  std::string nvme_path;
  int buffer_count = 4;
  int64_t buffer_size = 100000000, max_in_cpu = 1000000000;
  bool pipeline_read = false, pipeline_write = false;
};

struct ZeroConfig {
  int stage = 0;
  OffloadConfig offload_optimizer, offload_param;
  bool overlap_comm = false, contiguous_gradients = true, reduce_scatter = true;
  std::optional<int64_t> reduce_bucket_size, allgather_bucket_size, stage3_prefetch_bucket_size,
      stage3_param_persistence_threshold;  // nullopt = "auto"
  int64_t stage3_max_live_parameters = 1000000000, stage3_max_reuse_distance = 1000000000;
  int64_t sub_group_size = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
};

struct TrainConfig {
  int64_t steps = 0;  // 0: not set
  std::string data;   // llm.c shards / .npy (glob or comma list), or "synthetic"
  std::string save_dir;
  int64_t save_interval = 0, eval_interval = 0;
  std::string eval_data;     // held-out data for eval_interval (same forms as data)
  int64_t eval_batches = 4;  // global batches (train_batch_size samples each) an evaluation averages over
  uint64_t seed = 1234;
  std::string log_dir;
  int64_t seq_len = 0;  // 0: the model's default
  // Documents of zerorun shards: packed into windows of seq_len (true: attention and positions per document where
  // the graph has the "positions" input), or one a sequence, padded (false).
  bool packing = true;
  // The chunked head and loss (Executor::loss_chunk_bytes / loss_chunk_rows): each chunk's logits within this
  // many MiB (0: never chunked; -1, the default: 256 MiB chunks for vocabularies of 65536 tokens and more, none for
  // smaller ones, whose logits do not dominate memory and whose runs need not pay the extra head product), or this
  // many rows a chunk where > 0.
  int64_t loss_chunk_mib = -1, loss_chunk_rows = 0;
};

enum class Precision { FP32, BF16, FP16 };
const char* precision_name(Precision p);
// The storage type a precision rounds compute weights to (F32 for fp32).
DType precision_dtype(Precision p);

struct Config {
  std::string source;  // file path for messages
  nlohmann::json raw;
  std::optional<int64_t> train_batch_size, micro_batch, grad_accum;  // as given
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  std::string fp16_enabled = "false", bf16_enabled = "false";  // "true" | "false" | "auto"
  // bf16.bf16_master_weights_and_grads / bf16.bf16_optimizer_states (DeepSpeed): master weights and gradients in
  // bf16 (the compute weights are the master: no fp32 copy), Adam's moments in bf16. Cleared by resolve() unless
  // the run is bf16.
  bool bf16_master_weights_and_grads = false, bf16_optimizer_states = false;
  LossScaleConfig loss_scale;
  double gradient_clipping = 0.0;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool activation_checkpointing = false;
  // activation_checkpointing.recompute: "block" (the default), or of "norms", "mlp_act", "attention"; empty: none.
  std::vector<std::string> recompute = {"block"};
  ZeroConfig zero;
  zero::AioConfig aio;  // the "aio" block (NVMe offload's I/O)
  TrainConfig train;
  std::vector<std::string> warnings;
  // How each "auto" (and each alias or legacy spelling) was resolved: logged at start by the trainer.
  std::vector<std::string> notes;

  // Filled by resolve():
  int64_t batch = 0, micro = 0, gas = 0;
  int world_size = 1;
  Precision precision = Precision::FP32;
  Device device;  // where training runs (set by the trainer)
};

Config parse_config(const nlohmann::json& j, const std::string& source);
Config load_config(const std::string& path);

struct ResolveContext {
  int world_size = 1;
  int64_t hidden = 0;   // model width for bucket "auto" values (0 if unknown)
  bool on_gpu = false;  // bf16/fp16 "auto" -> bf16 on GPUs, fp32 on CPU
  bool gpu_has_bf16 = true;
};
// DeepSpeed's batch rule + "auto" values. Throws with DeepSpeed's message.
void resolve_config(Config& c, const ResolveContext& ctx);

}  // namespace zerorun
