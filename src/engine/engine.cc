// Training engine: one global step = gas micro-batches per rank, reduction,
// unscale + overflow agreement, global-norm clipping, optimizer update.
#include "zerorun/engine.h"

#include <cmath>
#include <set>
#include <sstream>

#include "kernels/cpu/cpu_kernels.h"

namespace zerorun {

Engine::Engine(const Model& model, const Config& cfg, Communicator& comm, int64_t total_steps)
    : model_(model), cfg_(cfg), comm_(comm) {
  ZR_CHECK(cfg_.world_size == comm.size(), "config resolved for world size ", cfg_.world_size, " but running ",
           comm.size(), " ranks");
  seq_len_ = cfg_.train.seq_len;
  if (model_.symbols.count("T")) {
    int64_t maxT = model_.symbols.at("T");
    if (seq_len_ == 0) seq_len_ = maxT;
    ZR_CHECK(seq_len_ <= maxT, "train.seq_len ", seq_len_, " exceeds the model's context of ", maxT);
  }
  std::map<std::string, int64_t> syms = {{"B", cfg_.micro}, {"T", seq_len_ ? seq_len_ : 1}};
  model_.graph.validate(model_.param_shapes(), syms);
  ZR_CHECK(comm.size() == 1 || cfg_.zero.stage <= 1, "ZeRO stage ", cfg_.zero.stage, " across ", comm.size(),
           " ranks is not implemented yet (stages 0 and 1 are); use \"stage\": 1 or one rank");
  // Flat layout from the ZeRO plan: one group per block (by first use).
  std::vector<zero::ParamInput> pin;
  {
    std::map<std::string, int> block_group;
    std::set<std::string> seen;
    int next = 0;
    for (auto& n : model_.graph.nodes)
      for (auto& [role, name] : n.params) {
        if (!seen.insert(name).second) continue;
        if (!block_group.count(n.block)) block_group[n.block] = next++;
        pin.push_back({name, model_.tensors.at(name).numel(), block_group[n.block]});
      }
  }
  plan_ = zero::plan(pin, comm.size(), 1);
  for (auto& slot : plan_.params) layout_[slot.name] = {slot.offset, model_.tensors.at(slot.name).shape()};
  numel_ = plan_.padded;
  const bool mixed = cfg_.precision != Precision::FP32;
  // In fp32 the master copy is the model's weights; with 16-bit compute it is optimizer state.
  master_ = Tensor::zeros({numel_}, DType::F32, mixed ? MemCategory::Optimizer : MemCategory::Params);
  grads_ = Tensor::zeros({numel_}, DType::F32, MemCategory::Grads);
  for (auto& [name, lay] : layout_) {
    const Tensor& src = model_.tensors.at(name);
    Tensor::view_of(master_, lay.first, lay.second).copy_from(src);
  }
  compute_ = mixed ? Tensor::zeros({numel_}, DType::F32, MemCategory::Params) : master_;
  std::map<std::string, Tensor> pv, gv;
  for (auto& [name, lay] : layout_) {
    pv[name] = Tensor::view_of(compute_, lay.first, lay.second);
    gv[name] = Tensor::view_of(grads_, lay.first, lay.second);
  }
  exec_ = std::make_unique<Executor>(model_.graph, pv, gv);
  if (cfg_.activation_checkpointing)
    for (size_t b = 0; b < model_.graph.blocks.size(); ++b)
      exec_->checkpoint_block[b] = b != 0 && b + 1 != model_.graph.blocks.size();
  // Stage >= 1: this rank keeps optimizer state for its shard only.
  opt_ = std::make_unique<Optimizer>(cfg_.optimizer, cfg_.zero.stage >= 1 ? plan_.shard_numel() : numel_);
  sched_ = std::make_unique<LrSchedule>(cfg_.scheduler, cfg_.optimizer, total_steps);
  scaler_ = std::make_unique<LossScaler>(cfg_.loss_scale, cfg_.precision == Precision::FP16);
  refresh_compute_params();
}

void Engine::refresh_compute_params() {
  if (compute_.raw() == master_.raw()) return;
  const DType dt = cfg_.precision == Precision::BF16 ? DType::BF16 : DType::F16;
  const float* m = master_.f32();
  float* c = compute_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < numel_; ++i) c[i] = round_to(dt, m[i]);
}

StepStats Engine::train_step(DataSource& data) {
  auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  const int W = comm_.size(), r = comm_.rank();
  const double scale = scaler_->scale();
  double loss_sum = 0.0;
  for (int64_t a = 0; a < cfg_.gas; ++a) {
    int64_t first = global_step_ * cfg_.batch + (a * W + r) * cfg_.micro;
    auto inputs = data.batch(first, cfg_.micro);
    loss_sum += exec_->forward(inputs);
    // DeepSpeed scales the loss by 1/gas (and by the fp16 loss scale).
    exec_->backward(static_cast<float>(scale / static_cast<double>(cfg_.gas)));
  }
  float* g = grads_.f32();
  if (after_backward) after_backward(g, numel_);
  // Average over ranks (data parallel).
  comm_.all_reduce(g, numel_, DType::F32, ReduceOp::Sum);
  if (W > 1) {
    float l = static_cast<float>(loss_sum);
    comm_.all_reduce(&l, 1, DType::F32, ReduceOp::Sum);
    loss_sum = l;
  }
  st.loss = loss_sum / static_cast<double>(cfg_.gas * W);
  const float inv = static_cast<float>(1.0 / (scale * W));
  kernels::cpu::scale_inplace(g, inv, numel_);
  float overflow = kernels::cpu::all_finite(g, numel_) ? 0.f : 1.f;
  comm_.all_reduce(&overflow, 1, DType::F32, ReduceOp::Max);
  ++global_step_;
  st.step = global_step_;
  st.loss_scale = scale;
  if (overflow > 0.f) {
    st.skipped = true;
    scaler_->update(true);
  } else {
    scaler_->update(false);
    double ss = kernels::cpu::sum_squares(g, numel_);
    st.grad_norm = std::sqrt(ss);
    if (cfg_.gradient_clipping > 0) {
      double coef = cfg_.gradient_clipping / (st.grad_norm + 1e-6);
      if (coef < 1.0) kernels::cpu::scale_inplace(g, static_cast<float>(coef), numel_);
    }
    LrMom lm = sched_->at(updates_ - 1);
    double beta1 =
        lm.beta1 ? *lm.beta1 : (cfg_.optimizer.type == "SGD" ? cfg_.optimizer.momentum : cfg_.optimizer.beta1);
    if (cfg_.zero.stage == 0) {
      opt_->step(master_.f32(), g, lm.lr, beta1);
    } else {
      opt_->begin_step();
      int64_t state_off = 0;
      for (size_t gi = 0; gi < plan_.groups.size(); ++gi) {
        zero::Range own = plan_.owned(static_cast<int>(gi), r);
        opt_->update(master_.f32() + own.begin, g + own.begin, state_off, own.size(), lm.lr, beta1);
        state_off += own.size();
      }
      if (W > 1) {  // every rank gets the updated shards of all others
        for (size_t gi = 0; gi < plan_.groups.size(); ++gi) {
          const zero::Group& grp = plan_.groups[gi];
          zero::Range own = plan_.owned(static_cast<int>(gi), r);
          std::vector<float> mine(master_.f32() + own.begin, master_.f32() + own.end);
          comm_.all_gather(mine.data(), master_.f32() + grp.offset, grp.shard, DType::F32);
        }
      }
    }
    st.lr = lm.lr;
    ++updates_;
    refresh_compute_params();
  }
  grads_.zero_();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.tokens = cfg_.batch * data.tokens_per_sample();
  return st;
}

std::map<std::string, Tensor> Engine::master_weights() const {
  std::map<std::string, Tensor> r;
  for (auto& [name, lay] : layout_)
    r[name] = Tensor::view_of(master_, lay.first, lay.second).clone(MemCategory::Buffers);
  return r;
}

std::string Engine::memory_report() const {
  MemStats s = mem_stats();
  std::ostringstream os;
  os << "memory rank " << comm_.rank() << ":";
  for (auto c : {MemCategory::Params, MemCategory::Grads, MemCategory::Optimizer, MemCategory::Activations,
                 MemCategory::Buffers}) {
    auto i = static_cast<size_t>(c);
    os << " " << mem_category_name(c) << "=" << s.current[i] / 1048576.0 << "MiB";
  }
  return os.str();
}

}  // namespace zerorun
