// Optimizers over a flat f32 range (the rank's shard under ZeRO), LR
// schedulers with DeepSpeed's formulas, and DeepSpeed's dynamic loss scaler.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "zerorun/config.h"
#include "zerorun/nvme.h"
#include "zerorun/tensor.h"
#include "zerorun/zero_state.h"

namespace zerorun {

// Where an update also writes the new weights rounded (the compute copies of an fp32 master): ZeRO's state says
// where (zero::UpdateTargets); AdamW does it in the same pass.
using RoundedOut = zero::UpdateTargets;

class Optimizer {
 public:
  // bf16_master: DeepSpeed's bf16.bf16_master_weights_and_grads (the weights given to step/update hold bf16 values
  // and stay so; gradients are rounded to bf16 first); bf16_states: bf16.bf16_optimizer_states (exp_avg and
  // exp_avg_sq stored as bf16, needs bf16_master). Adam/AdamW only.
  // `states`: the moments as ZeRO's state keeps them (ShardedState::make_moments: sized n, 1 array for SGD, else 2,
  // bf16 with bf16_states), placed there (memory or NVMe); null: the optimizer keeps its own in memory on `dev`.
  Optimizer(const OptimizerConfig& cfg, int64_t n, Device dev = Device::cpu(), bool bf16_master = false,
            bool bf16_states = false, zero::MomentStore* states = nullptr);
  // One update of p[0..n) from g; `lr` and `beta1` come from the scheduler.
  void step(float* p, const float* g, double lr, double beta1, RoundedOut out = {});
  // Sharded form: begin_step() once per optimizer step, then update() on
  // pieces; `state_offset` locates the piece inside this optimizer's state.
  void begin_step() { ++steps_; }
  void update(float* p, const float* g, int64_t state_offset, int64_t n, double lr, double beta1, RoundedOut out = {});
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // State tensors by name ("exp_avg", "exp_avg_sq" / "momentum_buffer"): F32, or BF16 with bf16 states. Empty
  // tensors when the states live on NVMe (place_on_nvme): read_state / write_state reach them anywhere.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // State k's elements [off, off + n) as f32 (bf16 states widened / rounded), wherever they live (host memory).
  void read_state(int k, int64_t off, int64_t n, float* dst);
  void write_state(int k, int64_t off, int64_t n, const float* src);
  // offload_optimizer.device "nvme": the states move to a file under nvme_path (zerorun::zero::NvmeStates), streamed
  // chunk by chunk (chunk_elems) around each update; host states only (CPU optimizer).
  void place_on_nvme(const std::string& nvme_path, int rank, int64_t chunk_elems, int buffer_count,
                     const zero::AioConfig& aio);
  const zero::NvmeStates* nvme() const { return st_->nvme(); }
  int64_t ram_bytes() const;   // state bytes in memory
  int64_t nvme_bytes() const;  // state bytes on NVMe (the file)
  const OptimizerConfig& config() const { return cfg_; }

 private:
  OptimizerConfig cfg_;
  int64_t n_;
  Device dev_;
  int64_t steps_ = 0;
  bool bf16_master_ = false, bf16_states_ = false;
  std::unique_ptr<zero::MomentStore> own_;  // the moments when no ShardedState keeps them
  zero::MomentStore* st_ = nullptr;
  // One update of [off, off + n) given the states' memory (m, v at the update's first element).
  void update_mem(float* p, const float* g, void* m, void* v, int64_t n, double lr, double beta1,
                  const RoundedOut& out);
};

struct LrMom {
  double lr;
  std::optional<double> beta1;  // OneCycle cycles momentum (Adam beta1 / SGD momentum)
};

// DeepSpeed 0.19.5's schedulers: at(k) is what optimizer step k+1 (0-based k) runs with. DeepSpeed steps the
// scheduler after the optimizer, so step 1 (at(-1)) runs with what the scheduler's constructor set and step k+1
// with get_lr() at last_batch_iteration + 1 + k (params.last_batch_iteration, default -1, starts a schedule
// part-way; with a value other than -1 the constructor sets nothing, so step 1 runs at the optimizer's own lr).
class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& s, const OptimizerConfig& o, int64_t total_steps);
  LrMom at(int64_t it) const;
  std::string type() const { return type_; }

 private:
  LrMom at_iteration(int64_t it) const;
  int64_t last_batch_iteration_ = -1;
  bool cycle_momentum_ = false;
  std::string type_;
  double base_lr_;
  nlohmann::json p_;
  double get(const char* k, double def) const;
};

class LossScaler {
 public:
  // fp16 with loss_scale 0 = dynamic; otherwise static (or 1 when disabled).
  LossScaler(const LossScaleConfig& c, bool enabled);
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Records one step's outcome (overflow -> step skipped). Throws at min scale.
  void update(bool overflow);
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0, min_scale_ = 1.0;
  int window_ = 1000, delayed_shift_ = 2, cur_hysteresis_ = 2;
  bool consecutive_ = false;
  int64_t cur_iter_ = 0, last_overflow_iter_ = -1;
};

}  // namespace zerorun
