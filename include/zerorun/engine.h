// The training engine (like deepspeed.initialize's engine): micro-batches ->
// forward/backward -> gradient reduction -> unscale/overflow check -> clip ->
// optimizer step -> refresh compute weights. Holds the flat master weights.
#pragma once
#include <chrono>
#include <functional>
#include <memory>

#include "zerorun/comm.h"
#include "zerorun/config.h"
#include "zerorun/data.h"
#include "zerorun/graph.h"
#include "zerorun/model.h"
#include "zerorun/optim.h"
#include "zerorun/zero_plan.h"

namespace zerorun {

struct StepStats {
  int64_t step = 0;  // 1-based index of the global step just taken
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool skipped = false;  // overflow: no update
  double seconds = 0;
  int64_t tokens = 0;  // tokens (or samples) processed by all ranks
};

class Engine {
 public:
  // `cfg` must be resolved for comm.size().
  Engine(const Model& model, const Config& cfg, Communicator& comm, int64_t total_steps);
  StepStats train_step(DataSource& data);
  int64_t global_step() const { return global_step_; }
  int64_t samples_seen() const { return global_step_ * cfg_.batch; }
  // Full fp32 master weights by name (gathered).
  std::map<std::string, Tensor> master_weights() const;
  const Model& model() const { return model_; }
  const Config& config() const { return cfg_; }
  std::string memory_report() const;
  int64_t seq_len() const { return seq_len_; }
  // Called with this rank's local gradients after backward, before any
  // reduction (tests use it to inject inf/nan on one rank).
  std::function<void(float* grads, int64_t n)> after_backward;

 private:
  void refresh_compute_params();
  const Model& model_;
  Config cfg_;
  Communicator& comm_;
  int64_t numel_ = 0, seq_len_ = 0;
  std::map<std::string, std::pair<int64_t, Shape>> layout_;  // name -> (offset, shape)
  zero::Plan plan_;                                          // flat layout: one group per graph block
  Tensor master_, compute_, grads_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LrSchedule> sched_;
  std::unique_ptr<LossScaler> scaler_;
  int64_t global_step_ = 0, updates_ = 0;
};

}  // namespace zerorun
