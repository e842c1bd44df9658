// ZeRO shard arithmetic as a pure function: from parameter sizes (grouped,
// e.g. one group per graph block), world size and alignment to padded flat
// buffers and the range each rank owns. No I/O, no state: tested exhaustively.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zerorun::zero {

struct Range {
  int64_t begin = 0, end = 0;  // half-open
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

struct ParamInput {
  std::string name;
  int64_t numel = 0;
  int group = 0;  // params of one group are gathered / reduced together
};

struct ParamSlot {
  std::string name;
  int64_t numel = 0;
  int group = 0;
  int64_t offset = 0;  // element offset inside the whole padded flat buffer
};

struct Group {
  int64_t offset = 0;       // start in the flat buffer
  int64_t numel = 0;        // real elements
  int64_t padded = 0;       // multiple of world * align
  int64_t shard = 0;        // padded / world
  std::vector<int> params;  // indices into Plan::params
};

struct Plan {
  int world = 1;
  int64_t align = 1;
  int64_t total = 0;   // real elements
  int64_t padded = 0;  // flat buffer length (sum of group paddings)
  std::vector<ParamSlot> params;
  std::vector<Group> groups;
  // Rank r's part of group g, in flat-buffer coordinates.
  Range owned(int group, int rank) const;
  // Elements rank r owns in total (the same for every rank).
  int64_t shard_numel() const;
  // Part of param p owned by rank r, in the param's own coordinates (may be empty).
  Range param_owned(int param, int rank) const;
};

// Groups keep the order given; params keep their order inside a group.
// Throws Error on world < 1, align < 1, negative sizes, duplicate names or
// group ids that are not 0..G-1 in first-appearance order.
Plan plan(const std::vector<ParamInput>& params, int world, int64_t align);

// The engine's buckets (src/zero/layout.cc): consecutive parameters of one block, in first-use order, up to
// `bucket` elements each (a larger parameter is a bucket of its own); each bucket is one plan group.
struct ParamUse {
  int block = 0;  // index of the graph block of the node that uses it (non-decreasing in node order)
  std::string name;
  int64_t numel = 0;
};
struct BucketLayout {
  std::vector<ParamInput> params;              // each parameter once, with its group: plan()'s input
  std::vector<std::vector<int>> block_groups;  // groups each block uses, ascending
  std::vector<int> ready_block;                // group -> the first block using it: its grads are complete after
                                               // that block's backward (-1: no block uses it)
  int num_groups() const { return static_cast<int>(ready_block.size()); }
};
BucketLayout bucket_layout(const std::vector<ParamUse>& uses, int num_blocks, int64_t bucket);

// Model-state bytes per rank that the engine allocates for P parameters (padding and the stage-3 persistent
// parameters aside), split by where they live. An Adam-family optimizer (two moments); `mixed`: 16-bit compute
// with an fp32 master; `gpu`: a CUDA run, whose 16-bit runs also keep the compute weights in 16 bits at
// stages 0-2; offload_optimizer moves master, moments and a gradient shard to host memory (GPU runs, stage >= 1),
// offload_param the stage-3 parameter shard. f32_read (< 0: all P): the parameters some op reads in f32
// (Graph::params_read_f32); a 16-bit GPU run with its master on the device and no f32 all-gather (stage 0, or
// one rank) keeps f32 compute values for those only.
struct StateEstimate {
  double params = 0, grads = 0, optimizer = 0;  // as Engine::model_state_bytes counts them
  double device = 0, host = 0;                  // the same bytes by location (host = all of it on CPU runs)
};
// bf16_master (bf16.bf16_master_weights_and_grads, CPU ranks): no fp32 master, the compute weights are it;
// bf16_states (bf16.bf16_optimizer_states): 2-byte moments.
StateEstimate estimate_model_states(double P, int stage, int world, bool mixed, bool gpu, bool offload_optimizer,
                                    bool offload_param, double f32_read = -1, bool bf16_master = false,
                                    bool bf16_states = false);

}  // namespace zerorun::zero
