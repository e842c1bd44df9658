// `zerorun estimate`: memory per rank and per node for every ZeRO stage, with and without offload, from a model's
// graph and parameter shapes alone (a model.bin's header, a config.json, or architecture flags: no weights), using
// the engine's own bucket layout and state accounting (src/zero) so its figures match the engine's counters.
#pragma once
#include <string>
#include <vector>

#include "zerorun/model.h"

namespace zerorun {

struct EstimateRequest {
  int gpus_per_node = 1, nodes = 1;                // ranks: one per GPU (or CPU slot with gpu false)
  bool gpu = true;                                 // the training device: cuda or cpu
  std::string precision = "bf16";                  // fp32 | bf16 | fp16
  int64_t micro_batch = 1, seq_len = 0;            // seq_len 0: the model's context (symbol T)
  int64_t reduce_bucket_size = 500000000;          // the engine's default (DeepSpeed's)
  int64_t stage3_prefetch_bucket_size = 50000000;  // the default before "auto" resolves it
  // bf16.bf16_master_weights_and_grads / bf16_optimizer_states (bf16 on CPU ranks; stages 1-3 rows)
  bool bf16_master = false, bf16_states = false;
  // NVMe offload (ZeRO-Infinity: offload_optimizer / offload_param device "nvme"), the keys that size it: DeepSpeed's
  // defaults, or a DeepSpeed config's values (`zerorun estimate --config`).
  int opt_buffer_count = 4;               // offload_optimizer.buffer_count: the moments' chunk slots in RAM
  int64_t sub_group_size = 1000000000;    // zero_optimization.sub_group_size: the moments' chunk (at most 16M elements)
  int param_buffer_count = 5;             // offload_param.buffer_count: the parameters' chunk slots in RAM
  int64_t param_buffer_size = 100000000;  // offload_param.buffer_size: the parameters' chunk (at most 16M elements)
  int64_t max_in_cpu = 1000000000;        // offload_param.max_in_cpu: parameter shard elements kept in RAM
  // The config these came from ("": the defaults) and what it asks for (stage -1: nothing), to name its row.
  std::string config;
  int config_stage = -1;
  std::string config_offload_optimizer = "none", config_offload_param = "none";
};

struct StageEstimate {
  int stage = 0;
  bool offload = false;                         // offload_optimizer (and offload_param at stage 3)
  double params = 0, grads = 0, optimizer = 0;  // model states per rank, as Engine::model_state_bytes counts them
  double states_device = 0, states_host = 0;    // the same bytes by where they live
  double buckets = 0;    // per rank, where the model runs: stage-2/3 gradient buckets and gathered stage-3 groups
  double device = 0;     // per rank on the GPU: states + buckets + activations (0 on CPU runs)
  double host_rank = 0;  // per rank in host memory (CPU runs: everything, plus the process's own)
  double host_node = 0;  // per node: gpus_per_node x host_rank
  // NVMe rows: offload_optimizer "nvme" (the moments in a file; the fp32 master in host RAM), and offload_param
  // "nvme" (stage 3: the parameter shard past max_in_cpu elements in a file). params/optimizer then count what stays
  // in RAM (as the engine's memory line does); host_rank includes the chunk slots.
  bool nvme_optimizer = false, nvme_param = false;
  double nvme_moments = 0, nvme_params = 0;  // per rank: state bytes on NVMe (the memory line's "... on NVMe=")
  double nvme_files = 0;                     // per rank: the files' sizes (rounded up to whole chunks): disk space
  double nvme_buffers = 0;                   // per rank: the chunk slots in RAM (the memory line's "buffers in RAM=")
};

struct MemoryEstimate {
  double params = 0;  // parameters
  int world = 1;
  double activations = 0;    // per rank at micro_batch x seq_len, f32 values (the engine's activations peak)
  double largest_block = 0;  // parameters of the largest block (stage-3 gathers)
  int64_t seq_len = 0;
  std::vector<StageEstimate> rows;  // stages 0-3, without then with offload (GPU runs, stages 1-3)
  std::vector<StageEstimate> nvme;  // stages 1-3 with offload_optimizer "nvme", then stage 3 with offload_param too
};

// NvmeStates' arithmetic (src/zero/nvme.cc): a file of `arrays` arrays of n elements of `elem_bytes`, read and
// written in chunks of chunk_elems (rounded up to 4096-byte alignment, at most n) through max(2, buffer_count) slots,
// no more than the file's chunks.
struct NvmeFileEstimate {
  double chunk = 0;    // elements a chunk
  double file = 0;     // bytes of the file
  double buffers = 0;  // bytes of the slots in RAM (as NvmeStates::buffer_bytes counts them; every slot gets a chunk)
};
NvmeFileEstimate estimate_nvme_file(int64_t n, int arrays, int elem_bytes, int64_t chunk_elems, int buffer_count);

// The process's own host memory beyond its tracked buffers (code, libraries, MPI, allocator): measured on CPU ranks.
constexpr double kProcessBaseBytes = 64.0 * 1048576;
// What a build with CUDA adds to every process, CPU ranks included: the CUDA libraries it links (measured: a tiny
// CPU run peaks at 164 MiB with them, 13 MiB without).
constexpr double kCudaLibrariesHostBytes = 150.0 * 1048576;
// kProcessBaseBytes, plus kCudaLibrariesHostBytes in a build with CUDA.
double process_base_bytes();

MemoryEstimate estimate_memory(const Model& m, const EstimateRequest& r);
std::string format_estimate(const MemoryEstimate& e, const EstimateRequest& r, const std::string& what);

}  // namespace zerorun
