// The training engine (like deepspeed.initialize's engine): micro-batches ->
// forward/backward -> gradient reduction -> unscale/overflow check -> clip ->
// optimizer step -> refresh compute weights, with ZeRO stages 0-3:
//   0: full grads all-reduced, full optimizer on every rank;
//   1: + optimizer state (and 16-bit mode's fp32 master) sharded;
//   2: + gradients reduce-scattered per bucket as blocks finish backward;
//   3: + parameters sharded, gathered per bucket before a block's forward and
//      backward (next block prefetched asynchronously) and freed after.
#pragma once
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <set>

#include "zerorun/comm.h"
#include "zerorun/config.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/data.h"
#include "zerorun/graph.h"
#include "zerorun/model.h"
#include "zerorun/optim.h"
#include "zerorun/zero_plan.h"
#include "zerorun/zero_state.h"

namespace zerorun::kernels {
class Backend;
}

namespace zerorun {

// Bytes this rank's process holds now, by MemCategory (params, grads, optimizer, activations, buffers): in host
// memory (the allocator's host counters), in device memory (its device counters: GPU runs), on NVMe (the
// ShardedState buffers placed there: the stage-3 parameter shard under offload_param "nvme", the moments under
// offload_optimizer "nvme"), how many of the host bytes are page-locked (pin_memory), and the host memory of the
// NVMe files' staging slots (outside the allocator's counters, so beside `host`).
struct MemoryNow {
  using ByCategory = std::array<int64_t, static_cast<size_t>(MemCategory::Count)>;
  ByCategory host{}, device{}, nvme{};
  int64_t pinned = 0, nvme_buffers = 0;
  int64_t nvme_total() const;
};

struct StepStats {
  int64_t step = 0;  // 1-based index of the global step just taken
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool skipped = false;  // overflow: no update
  double seconds = 0;
  // Of `seconds`, this rank's optimizer update (with offload: the gradient shard's copy to the host, the CPU
  // optimizer, the weights' refresh and gather): what the update costs a step.
  double optimizer_seconds = 0;
  // Waiting on NVMe reads and writes: the moments (in the update), the parameters (all step).
  double nvme_wait_seconds = 0;
  // GPU runs with offload: of `seconds`, the wall time of the offloaded state's synchronous host<->device copies
  // (ShardedState::transfer_seconds): each group's gradient piece to the host before its CPU update, the refreshed
  // weights back to the device after it, and with offload_param the shard's pieces to the device for the stage-3
  // gathers (a synchronous copy also waits for the compute queued before it). The all-gathers are not in it.
  double transfer_wait_seconds = 0;
  int64_t tokens = 0;  // tokens (or samples) processed by all ranks
  MemoryNow memory;    // at the step's end
};

// Bytes this rank keeps between steps for model states.
struct ModelStateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

class Engine {
 public:
  // `cfg` must be resolved for comm.size().
  Engine(const Model& model, const Config& cfg, Communicator& comm, int64_t total_steps);
  ~Engine();
  StepStats train_step(DataSource& data);
  // Mean loss over `batches` global batches of `data` from its first sample (the same samples at any world size
  // and micro batch), forward only: no gradients, no update, the training state untouched. Collective.
  double eval_loss(DataSource& data, int64_t batches);
  int64_t global_step() const { return global_step_; }
  // Samples consumed so far: where the next step's data starts (kept across a resume with another batch size).
  int64_t samples_seen() const { return samples_seen_; }
  // Full fp32 master weights by name (gathered from all ranks: collective).
  std::map<std::string, Tensor> master_weights();
  const Model& model() const { return model_; }
  const Config& config() const { return cfg_; }
  const zero::Plan& plan() const { return state_->plan(); }
  const zero::ShardedState& sharded_state() const { return *state_; }
  std::string memory_report() const;
  MemoryNow memory_now() const;
  // GPU runs with offload_optimizer: the step reports transfer_wait_seconds.
  bool offloads() const { return offload_; }
  // Where the optimizer's states live and in what type: the fp32 master (or what serves as it) and the moments.
  std::string optimizer_report() const;
  ModelStateBytes model_state_bytes() const;
  int64_t seq_len() const { return seq_len_; }
  // Sharded checkpoint of every rank's state under save_dir/global_step<N>/
  // (collective). `latest` moves only after every rank's shard is on disk.
  // Returns the tag.
  std::string save_checkpoint(const std::string& save_dir, const nlohmann::json& client_state = {});
  // Loads `tag` ("latest" or "global_step<N>") from save_dir; works at any
  // world size and ZeRO stage. Returns the manifest's client state.
  nlohmann::json load_checkpoint(const std::string& save_dir, const std::string& tag = "latest");
  // Called with this rank's gradient buffer before the cross-rank overflow
  // agreement (tests use it to inject inf/nan on one rank).
  std::function<void(float* grads, int64_t n)> after_backward;
  // Whether micro-batches run as replayed CUDA graphs (stages 0-1 on a GPU, ZERORUN_CUDA_GRAPHS unset or 1).
  bool cuda_graphs() const { return use_graphs_; }
  int64_t graph_captures() const { return graph_captures_; }

 private:
  // One micro-batch's forward + backward, captured as a CUDA graph and replayed: [0] a step's first (fresh
  // gradients), [1] the others. Captured at first use after one eager step, again when d(loss) changes (the
  // fp16 loss scale) or the inputs' shapes do. The graphs read the inputs from graph_inputs_ and leave the loss in
  // `loss`, which is copied out before the next replay.
  struct MicroGraph {
    cuda::Graph graph;
    float loss_grad = 0.f;
    Tensor loss;
  };
  Tensor forward_backward(const std::map<std::string, Tensor>& inputs, bool fresh, float loss_grad);
  Tensor micro_graphed(const std::map<std::string, Tensor>& host_inputs, bool fresh, float loss_grad);
  // The step's view of ZeRO's state: the hooks around each block (stages 2-3) and the update piece by piece.
  void on_block(size_t b, bool forward, bool before) { state_->on_block(b, forward, before); }
  // The main stream waits for any update still on the side stream (before state is read or written).
  void settle();
  kernels::Backend& be() const;

  const Model& model_;
  Config cfg_;
  Communicator& comm_;
  Device dev_;            // training device
  bool offload_ = false;  // offload_optimizer on a GPU run: the master and the optimizer on the host
  int stage_ = 0;
  bool mixed_ = false;
  bool bf16_master_ = false;  // bf16.bf16_master_weights_and_grads: the compute weights are the master
  int64_t seq_len_ = 0;
  // Flat buffers, buckets, stage-3 gathers, gradient buckets, compute copies, checkpoint ranges (src/zero).
  std::unique_ptr<zero::ShardedState> state_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LrSchedule> sched_;
  std::unique_ptr<LossScaler> scaler_;
  int64_t global_step_ = 0, updates_ = 0, samples_seen_ = 0;
  bool use_graphs_ = false;
  double masked_weight(const std::vector<std::map<std::string, Tensor>>& micro, bool may_ignore);
  int64_t steps_run_ = 0, graph_captures_ = 0;
  MicroGraph graphs_[2];
  std::map<std::string, Tensor> graph_inputs_;
  // The update on a side stream (see the constructor); declared last, so destroyed (its stream waited for) first.
  bool overlap_ = false;
  std::unique_ptr<cuda::SideStream> side_;
};

}  // namespace zerorun
