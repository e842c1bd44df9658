// Training engine: one global step = gas micro-batches per rank, reduction
// (all-reduce for stages 0-1, per-bucket reduce-scatter during backward for
// stages 2-3), unscale + overflow agreement, global-norm clipping across
// shards, optimizer update of this rank's shard, and re-gathering weights.
#include "zerorun/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "kernels/backend.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"
#include "zerorun/profile.h"

namespace zerorun {

Engine::Engine(const Model& model, const Config& cfg, Communicator& comm, int64_t total_steps)
    : model_(model), cfg_(cfg), comm_(comm) {
  ZR_CHECK(cfg_.world_size == comm.size(), "config resolved for world size ", cfg_.world_size, " but running ",
           comm.size(), " ranks");
  stage_ = cfg_.zero.stage;
  dev_ = cfg_.device;
  return_large_host_blocks();
  // CPU offload (GPU runs): fp32 master + optimizer state in host memory,
  // updated by the CPU optimizer; stage 3 offload_param keeps the parameter
  // shards in host memory too and streams them in per bucket. On CPU runs
  // everything already lives in host memory.
  offload_ = dev_.is_cuda() && cfg_.zero.offload_optimizer.device != "none";  // cpu or nvme
  const bool offload_param = dev_.is_cuda() && stage_ == 3 && cfg_.zero.offload_param.device != "none";
  ZR_CHECK(!offload_ || stage_ >= 1, "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is 0)");
  ZR_CHECK(!offload_param || offload_, "offload_param on a GPU run needs offload_optimizer too");
  mixed_ = cfg_.precision != Precision::FP32;
  // bf16.bf16_master_weights_and_grads: the bf16 compute weights are the master (no fp32 copy), updated in place by
  // the CPU optimizer, which rounds the gradient and the new weights to bf16.
  bf16_master_ = mixed_ && cfg_.bf16_master_weights_and_grads;
  ZR_CHECK(!bf16_master_ || dev_.is_cpu() || offload_, "bf16.bf16_master_weights_and_grads / bf16_optimizer_states ",
           "on a GPU run need zero_optimization.offload_optimizer (the CPU optimizer keeps the bf16 master and ",
           "moments); without it they are not implemented on GPUs yet");
  seq_len_ = cfg_.train.seq_len;
  if (model_.symbols.count("T")) {
    int64_t maxT = model_.symbols.at("T");
    if (seq_len_ == 0) seq_len_ = maxT;
    ZR_CHECK(seq_len_ <= maxT, "train.seq_len ", seq_len_, " exceeds the model's context of ", maxT);
  }
  std::map<std::string, int64_t> syms = {{"B", cfg_.micro}, {"T", seq_len_ ? seq_len_ : 1}};
  model_.graph.validate(model_.param_shapes(), syms);
  be().set_matmul_dtype(precision_dtype(cfg_.precision));

  // ZeRO's state (src/zero): the buckets from the graph's blocks, this rank's weights read from the model range by
  // range, the master, the gradient buffers, each where the configuration places it.
  std::vector<zero::ParamUse> uses;
  std::map<std::string, Shape> shapes;
  const auto& blocks = model_.graph.blocks;
  auto ranges = model_.graph.block_ranges();
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t i = ranges[b].first; i < ranges[b].second; ++i)
      for (auto& [role, name] : model_.graph.nodes[i].params) {
        uses.push_back({static_cast<int>(b), name, model_.numel(name)});
        shapes[name] = model_.shape(name);
      }
  zero::StateOptions so;
  so.stage = stage_;
  so.device = dev_;
  so.compute_dtype = mixed_ ? precision_dtype(cfg_.precision) : DType::F32;
  so.bf16_master = bf16_master_;
  so.offload_optimizer = offload_;
  so.offload_param = offload_param;
  so.pin_optimizer = cfg_.zero.offload_optimizer.pin_memory;
  so.pin_param = cfg_.zero.offload_param.pin_memory;
  // DeepSpeed allows a reduce_bucket_size of 0 (a bucket per parameter), as a bucket of 1 element does here (the
  // estimate's rule too).
  so.bucket = cfg_.zero.reduce_bucket_size.value_or(std::numeric_limits<int64_t>::max());
  so.persistence_threshold = cfg_.zero.stage3_param_persistence_threshold.value_or(0);
  so.prefetch_bucket = cfg_.zero.stage3_prefetch_bucket_size.value_or(0);
  so.max_live = cfg_.zero.stage3_max_live_parameters;
  // offload_param "nvme" (ZeRO-Infinity): the parameter shard past max_in_cpu elements in a file under nvme_path, read
  // and written in chunks of buffer_size elements (at most 16M) through buffer_count slots.
  if (stage_ == 3 && cfg_.zero.offload_param.device == "nvme") {
    const OffloadConfig& o = cfg_.zero.offload_param;
    so.param_nvme_path = o.nvme_path;
    so.param_max_in_cpu = o.max_in_cpu;
    so.param_nvme_chunk = std::min<int64_t>(o.buffer_size, int64_t{1} << 24);
    so.param_nvme_buffers = o.buffer_count;
    so.aio = cfg_.aio;
  }
  state_ = std::make_unique<zero::ShardedState>(uses, static_cast<int>(blocks.size()), shapes, so, comm_,
                                                [this](const std::string& name, int64_t first, int64_t count,
                                                       float* dst) { model_.read_f32(name, first, count, dst); });

  exec_ = std::make_unique<Executor>(model_.graph, state_->param_views(), state_->grad_views());
  state_->bind({[this](const std::string& n, const Tensor& t) { exec_->set_param(n, t); },
                [this](const std::string& n, const Tensor& t) { exec_->set_grad(n, t); }});
  if (state_->compute16().defined()) {
    exec_->set_params16(state_->param16_views());
    // Stages 1-2 on several ranks all-gather the 16-bit copy (the f32 copy follows it); offload refreshes the full
    // f32 copy from the host master.
    if (state_->master().defined() && !offload_)
      state_->make_compact([this](const std::string& n) { return exec_->reads_f32(n); });
  }
  const bool auto_chunks = cfg_.train.loss_chunk_mib < 0;  // large vocabularies only
  exec_->loss_chunk_bytes = (auto_chunks ? int64_t{256} : cfg_.train.loss_chunk_mib) << 20;
  exec_->loss_chunk_min_vocab = auto_chunks ? 65536 : 0;
  exec_->loss_chunk_rows = cfg_.train.loss_chunk_rows;
  if (cfg_.activation_checkpointing) {
    // Every block but the first (embeddings) and the last (head and loss): the whole block, or selected ops.
    std::vector<bool> inner(model_.graph.blocks.size());
    for (size_t b = 0; b < inner.size(); ++b) inner[b] = b != 0 && b + 1 != inner.size();
    std::set<std::string> classes(cfg_.recompute.begin(), cfg_.recompute.end());
    if (classes.erase("block")) exec_->checkpoint_block = inner;
    exec_->set_recompute(classes, inner);
  }
  if (stage_ >= 2) {
    exec_->hooks.before_block_forward = [this](size_t b) { on_block(b, true, true); };
    exec_->hooks.after_block_forward = [this](size_t b) { on_block(b, true, false); };
    exec_->hooks.before_block_backward = [this](size_t b) { on_block(b, false, true); };
    exec_->hooks.after_block_backward = [this](size_t b) { on_block(b, false, false); };
  }
  const zero::Plan& plan = state_->plan();
  // The optimizer's moments are ZeRO state (zero::MomentStore): where the optimizer runs, or on NVMe.
  const bool bf16_states = bf16_master_ && cfg_.bf16_optimizer_states;
  zero::MomentStore& moments =
      state_->make_moments(cfg_.optimizer.type == "SGD" ? 1 : 2, bf16_states ? DType::BF16 : DType::F32);
  opt_ = std::make_unique<Optimizer>(cfg_.optimizer, stage_ == 0 ? plan.padded : plan.shard_numel(),
                                     offload_ ? Device::cpu() : dev_, bf16_master_, bf16_states, &moments);
  // offload_optimizer "nvme" (ZeRO-Infinity): the CPU optimizer's moments live in a file under nvme_path, streamed
  // in chunks of sub_group_size elements (at most 16M) around each update (src/zero/nvme.cc).
  if (cfg_.zero.offload_optimizer.device == "nvme") {
    ZR_CHECK(stage_ >= 1, "offload_optimizer \"nvme\" needs ZeRO stage 1, 2 or 3 (stage is 0)");
    const OffloadConfig& o = cfg_.zero.offload_optimizer;
    const int64_t chunk = std::min<int64_t>(cfg_.zero.sub_group_size, int64_t{1} << 24);
    moments.place_on_nvme(o.nvme_path, comm_.rank(), chunk, o.buffer_count, cfg_.aio);
  }
  sched_ = std::make_unique<LrSchedule>(cfg_.scheduler, cfg_.optimizer, total_steps);
  scaler_ = std::make_unique<LossScaler>(cfg_.loss_scale, cfg_.precision == Precision::FP16);
  // CUDA graphs where a micro-batch's work is the same kernels on the same buffers every time: stages 0-1 (no
  // per-bucket collectives or gathers inside the backward), not under the synchronised profiler, not with dropout
  // (its masks change every micro-batch).
  use_graphs_ = dev_.is_cuda() && stage_ < 2 && !profile::enabled() && knobs().cuda_graphs && !exec_->has_dropout();
  // One GPU, stages 0-1 with graphs and the compact copy: the update runs group by group on a side stream below
  // the main one in priority, so that the next forward's block waits only for its own groups (the backward for
  // all); ZERORUN_OPT_OVERLAP=0 keeps it on the main stream.
  overlap_ = use_graphs_ && state_->compact() && comm_.size() == 1 && knobs().opt_overlap;
  if (overlap_) {
    side_ = std::make_unique<cuda::SideStream>(static_cast<int>(plan.groups.size()) + 1);
    exec_->hooks.before_block_forward = [this](size_t b) {
      for (int grp : state_->block_groups()[b]) side_->main_waits(grp);
    };
  }
}

Engine::~Engine() = default;  // the side stream first (declared last), ZeRO's state (its gathers waited for) later

kernels::Backend& Engine::be() const { return kernels::backend(dev_); }

// ---- the step -----------------------------------------------------------------

// d(loss) announced before the forward (the loss op can make its input's gradient there); `fresh`: this backward
// overwrites the gradient buffer. Returns the loss, not yet read.
Tensor Engine::forward_backward(const std::map<std::string, Tensor>& inputs, bool fresh, float loss_grad) {
  exec_->set_next_loss_grad(loss_grad);
  if (fresh) exec_->mark_grads_fresh();
  Tensor loss = exec_->forward_async(inputs);
  if (overlap_) side_->main_waits(static_cast<int>(state_->plan().groups.size()));  // the update read these gradients
  exec_->backward(loss_grad);
  return loss;
}

Tensor Engine::micro_graphed(const std::map<std::string, Tensor>& host_inputs, bool fresh, float loss_grad) {
  bool same = graph_inputs_.size() == host_inputs.size();
  for (auto& [k, t] : host_inputs) {
    auto it = graph_inputs_.find(k);
    same = same && it != graph_inputs_.end() && it->second.shape() == t.shape() && it->second.dtype() == t.dtype();
  }
  if (!same) {  // new input buffers: the graphs read the old ones
    for (auto& mg : graphs_) mg.graph.reset(), mg.loss = Tensor();
    graph_inputs_.clear();
    for (auto& [k, t] : host_inputs)
      graph_inputs_[k] = Tensor::empty(t.shape(), t.dtype(), MemCategory::Activations, dev_);
  }
  for (auto& [k, t] : host_inputs) cuda::upload(graph_inputs_.at(k).raw(), t.raw(), t.nbytes());
  MicroGraph& mg = graphs_[fresh ? 0 : 1];
  if (!mg.graph.ready() || mg.loss_grad != loss_grad) {
    mg.loss = Tensor();
    mg.graph.begin_capture();
    try {
      mg.loss = forward_backward(graph_inputs_, fresh, loss_grad);
    } catch (...) {
      mg.graph.abort_capture();
      exec_->release();
      throw;
    }
    mg.graph.end_capture();
    mg.loss_grad = loss_grad;
    ++graph_captures_;
  }
  mg.graph.launch();
  Tensor l = Tensor::empty({}, DType::F32, MemCategory::Activations, dev_);
  be().round_to(DType::F32, mg.loss.f32(), l.f32(), 1);  // queued: taken before the next replay writes it
  return l;
}

void Engine::settle() {
  if (side_) side_->main_waits(static_cast<int>(state_->plan().groups.size()));
}

double Engine::eval_loss(DataSource& data, int64_t batches) {
  profile::Scope whole(".. eval");
  const int W = comm_.size(), r = comm_.rank();
  std::vector<Tensor> losses;  // (b, a) order
  exec_->set_dropout({});      // evaluation drops nothing
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t a = 0; a < cfg_.gas; ++a) {  // the micro-batches a training step of this batch would take
      std::map<std::string, Tensor> inputs = data.batch(b * cfg_.batch + (a * W + r) * cfg_.micro, cfg_.micro);
      if (!dev_.is_cpu())
        for (auto& [k, t] : inputs) t = t.to(dev_, MemCategory::Activations);
      losses.push_back(exec_->forward_async(inputs));
      exec_->release();  // no backward: the saved activations go now
    }
  std::vector<float> mine;
  for (auto& l : losses) mine.push_back(be().get_scalar(l.f32()));
  state_->release_all();  // stage 3: the forward leaves the last block gathered for a backward that does not come
  // Every micro-batch's loss, added in f64 in the order of their samples: the same sum on any number of ranks
  // that splits the batches into the same micro-batches.
  const size_t k = mine.size();
  std::vector<float> all(k * static_cast<size_t>(W));
  comm_.all_gather(mine.data(), all.data(), static_cast<int64_t>(k), DType::F32);
  double sum = 0.0;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t a = 0; a < cfg_.gas; ++a)
      for (int q = 0; q < W; ++q) sum += static_cast<double>(all[static_cast<size_t>(q) * k + b * cfg_.gas + a]);
  return sum / static_cast<double>(batches * cfg_.gas * W);
}

// 0 where the data source never ignores targets (the plain 1 / (gas W) weighting, no collective); else rows of a
// micro-batch / the global batch's counted targets (summed over every rank, each step), each micro-batch's weight
// in the mean.
double Engine::masked_weight(const std::vector<std::map<std::string, Tensor>>& micro, bool may_ignore) {
  if (!may_ignore) return 0.0;
  int32_t counted = 0;
  int64_t rows = 0;
  for (const auto& in : micro) {
    const Tensor& t = in.at("targets");
    rows = t.numel();
    for (int64_t i = 0; i < t.numel(); ++i) counted += t.i32()[i] != -100;
  }
  if (comm_.size() > 1) comm_.all_reduce(&counted, 1, DType::I32, ReduceOp::Sum);
  ZR_CHECK(counted > 0, "every target of the global batch is -100 (ignored): nothing to train on in step ",
           global_step() + 1);
  return static_cast<double>(rows) / static_cast<double>(counted);
}

StepStats Engine::train_step(DataSource& data) {
  auto t0 = std::chrono::steady_clock::now();
  const double param_wait0 = state_->param_nvme() ? state_->param_nvme()->wait_seconds() : 0.0;
  const double transfer0 = state_->transfer_seconds();
  profile::Scope whole(".. train_step (whole)");
  StepStats st;
  const int W = comm_.size(), r = comm_.rank();
  const double scale = scaler_->scale();
  double loss_sum = 0.0;
  std::vector<Tensor> losses;  // read after every backward is queued (one wait instead of one per forward)
  std::vector<std::map<std::string, Tensor>> micro(static_cast<size_t>(cfg_.gas));
  {
    profile::Scope ps("data");
    for (int64_t a = 0; a < cfg_.gas; ++a) micro[a] = data.batch(samples_seen_ + (a * W + r) * cfg_.micro, cfg_.micro);
  }
  // Targets of -100 (transformers' ignore_index: prompts, padding) add nothing: the loss is the mean over the
  // targets of the whole global batch, as transformers computes it with num_items_in_batch, so every
  // micro-batch weighs by its rows (the op's mean divides by them) over the batch's counted targets.
  const double weight = masked_weight(micro, data.may_ignore_targets());
  if (weight > 0) use_graphs_ = false;  // the loss gradient changes every step
  for (int64_t a = 0; a < cfg_.gas; ++a) {
    std::map<std::string, Tensor>& inputs = micro[static_cast<size_t>(a)];
    // DeepSpeed scales the loss by 1/gas (and by the fp16 loss scale); known before the forward, so the loss op
    // can make its input's gradient there.
    const float loss_grad = static_cast<float>(weight > 0 ? scale * weight * W : scale / static_cast<double>(cfg_.gas));
    // Stages 0-1: the step's first backward overwrites the gradient buffer (no zero-fill of it each step).
    const bool fresh = a == 0 && stage_ < 2;
    // Dropout masks by the global index of the micro-batch's first sample: the same on any number of ranks.
    exec_->set_dropout(
        {true, cfg_.train.seed, static_cast<uint64_t>(global_step() + 1), samples_seen_ + (a * W + r) * cfg_.micro});
    if (use_graphs_ && steps_run_ > 0) {  // the first step runs eagerly: lazy set-up stays out of the graphs
      losses.push_back(micro_graphed(inputs, fresh, loss_grad));
      continue;
    }
    if (!dev_.is_cpu())  // queued behind the previous step's update, not waiting for it
      for (auto& [k, t] : inputs) {
        Tensor d = Tensor::empty(t.shape(), t.dtype(), MemCategory::Activations, dev_);
        cuda::upload(d.raw(), t.raw(), t.nbytes());
        t = d;
      }
    losses.push_back(forward_backward(inputs, fresh, loss_grad));
  }
  ++steps_run_;
  {
    profile::Scope ps("wait loss");
    for (auto& l : losses) loss_sum += static_cast<double>(be().get_scalar(l.f32()));
  }
  const Tensor& gbuf = state_->grads();
  float* g = gbuf.f32();
  const int64_t gn = gbuf.numel();
  if (after_backward) after_backward(g, gn);
  if (stage_ < 2) {
    profile::Scope ps("all_reduce grads");
    comm_.all_reduce(g, gn, DType::F32, ReduceOp::Sum);
  }  // stages 2-3 reduced during backward
  if (W > 1) {
    float l = static_cast<float>(loss_sum);
    comm_.all_reduce(&l, 1, DType::F32, ReduceOp::Sum);
    loss_sum = l;
  }
  st.loss = weight > 0 ? loss_sum * weight : loss_sum / static_cast<double>(cfg_.gas * W);
  if (scale * W != 1.0) be().scale_inplace(g, static_cast<float>(1.0 / (scale * W)), gn);
  bool finite = true;
  double ss = 0.0;
  {
    profile::Scope ps("wait grad check");
    ss = be().finite_sum_squares(g, gn, &finite);  // one pass: overflow check and the norm's squares
  }
  float overflow = finite ? 0.f : 1.f;
  comm_.all_reduce(&overflow, 1, DType::F32, ReduceOp::Max);
  ++global_step_;
  samples_seen_ += cfg_.batch;  // a skipped step consumed its batch too, as in DeepSpeed
  st.step = global_step_;
  st.loss_scale = scale;
  if (overflow > 0.f) {
    st.skipped = true;
    scaler_->update(true);
  } else {
    scaler_->update(false);
    if (stage_ >= 2 && W > 1) {  // shards: add the squares of every rank
      float f = static_cast<float>(ss);
      comm_.all_reduce(&f, 1, DType::F32, ReduceOp::Sum);
      ss = f;
    }
    st.grad_norm = std::sqrt(ss);
    if (cfg_.gradient_clipping > 0) {
      double coef = cfg_.gradient_clipping / (st.grad_norm + 1e-6);
      if (coef < 1.0) be().scale_inplace(g, static_cast<float>(coef), gn);
    }
    const auto t_opt = std::chrono::steady_clock::now();
    const double nvme_wait0 = opt_->nvme() ? opt_->nvme()->wait_seconds() : 0.0;
    LrMom lm = sched_->at(updates_ - 1);
    double beta1 =
        lm.beta1 ? *lm.beta1 : (cfg_.optimizer.type == "SGD" ? cfg_.optimizer.momentum : cfg_.optimizer.beta1);
    {
      profile::Scope ps("optimizer");
      if (stage_ == 0 && !overlap_) {
        opt_->step(state_->full_master(), g, lm.lr, beta1, state_->update_targets(0));
      } else {  // group by group: this rank's shards (stages 1-3), or every group on the side stream (overlap_)
        std::optional<cuda::SideStream::Scope> on;
        if (overlap_) side_->after_main(), on.emplace(*side_);  // after the (clipped) gradients
        const int n = static_cast<int>(state_->plan().groups.size());
        opt_->begin_step();
        for (int gi = 0; gi < n; ++gi) {
          // With offload: the gradient shard copied to the host, the CPU optimizer on the host master.
          const zero::UpdatePiece u = state_->update_piece(gi);
          opt_->update(u.weights, u.grads, u.state_offset, u.n, lm.lr, beta1, state_->update_targets(u.flat_begin));
          state_->end_update_piece(gi);
          if (overlap_) side_->record(gi);
        }
        if (overlap_) side_->record(n);
      }
    }
    st.lr = lm.lr;
    ++updates_;
    {
      profile::Scope ps("refresh+gather params");
      // With offload: the host master's new weights to the device (and their gather).
      state_->after_update(state_->update_targets(0).f32 != nullptr);
    }
    st.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
    if (opt_->nvme()) st.nvme_wait_seconds = opt_->nvme()->wait_seconds() - nvme_wait0;
  }
  // offload_param "nvme": the parameters' reads and writes over the whole step (gathers, update, refresh).
  if (state_->param_nvme()) st.nvme_wait_seconds += state_->param_nvme()->wait_seconds() - param_wait0;
  // Stages 2-3 accumulate each step's reduced shards; a skipped step's non-finite values are cleared as well
  // (stages 0-1 otherwise overwrite the buffer in the next backward; its padding is never written).
  if (stage_ >= 2 || st.skipped) gbuf.zero_();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.transfer_wait_seconds = state_->transfer_seconds() - transfer0;
  st.tokens = cfg_.batch * data.tokens_per_sample();
  st.memory = memory_now();
  return st;
}

std::map<std::string, Tensor> Engine::master_weights() {
  settle();
  return state_->full_master_weights();
}

ModelStateBytes Engine::model_state_bytes() const {
  ModelStateBytes b;
  b.params = state_->param_bytes();
  b.grads = state_->grad_bytes();
  b.optimizer = state_->master_bytes() + opt_->ram_bytes();
  return b;
}

namespace {
// Where an NVMe file is and how it is read, and its chunk slots in RAM (what the memory line says of each file).
std::string nvme_file_report(const zero::NvmeStates& f) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << f.path() << (f.direct() ? ", O_DIRECT" : ", buffered: the filesystem refused O_DIRECT")
     << "; buffers in RAM=" << f.buffer_bytes() / 1048576.0 << "MiB";
  return os.str();
}
}  // namespace

std::string Engine::optimizer_report() const {
  std::ostringstream os;
  os.precision(3);
  const bool bf16_states = bf16_master_ && cfg_.bf16_optimizer_states;
  const bool host = dev_.is_cpu() || offload_;
  os << std::fixed << "optimizer states in " << (host ? "host RAM" : "device memory") << ": master=";
  if (state_->master().defined())
    os << state_->master_bytes() / 1048576.0 << (bf16_master_ ? "MiB (bf16 values in f32)" : "MiB (fp32)");
  else
    os << (bf16_master_ ? "the bf16 compute weights" : "the fp32 compute weights");
  if (opt_->nvme())
    os << " moments on NVMe=" << opt_->nvme_bytes() / 1048576.0 << "MiB (" << (bf16_states ? "bf16" : "f32") << ", "
       << nvme_file_report(*opt_->nvme()) << ")";
  else
    os << " moments=" << opt_->ram_bytes() / 1048576.0 << "MiB (" << (bf16_states ? "bf16" : "f32") << ")";
  if (const zero::NvmeStates* pn = state_->param_nvme())
    os << "; parameters on NVMe=" << state_->param_nvme_bytes() / 1048576.0 << "MiB (" << nvme_file_report(*pn) << ")";
  return os.str();
}

int64_t MemoryNow::nvme_total() const {
  int64_t t = 0;
  for (int64_t b : nvme) t += b;
  return t;
}

MemoryNow Engine::memory_now() const {
  MemoryNow m;
  m.host = mem_stats(false).current;
  if (!dev_.is_cpu()) m.device = mem_stats(true).current;
  for (const zero::BufferInfo& b : state_->buffers()) {
    if (b.placement == zero::Placement::Nvme) m.nvme[static_cast<size_t>(b.category)] += b.bytes;
    if (b.placement == zero::Placement::PinnedHost) m.pinned += b.bytes;
  }
  if (const zero::NvmeStates* n = opt_->nvme()) m.nvme_buffers += n->buffer_bytes();
  if (const zero::NvmeStates* n = state_->param_nvme()) m.nvme_buffers += n->buffer_bytes();
  return m;
}

std::string Engine::memory_report() const {
  ModelStateBytes b = model_state_bytes();
  const MemoryNow now = memory_now();
  MemStats s = mem_stats(), act = mem_stats(!dev_.is_cpu());  // activations live where the model runs
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "memory rank " << comm_.rank() << (dev_.is_cpu() ? "" : " (cuda)")
     << ": model states params=" << b.params / 1048576.0 << "MiB grads=" << b.grads / 1048576.0
     << "MiB optimizer=" << b.optimizer / 1048576.0 << "MiB [" << optimizer_report() << "]"
     << " | activations peak=" << act.peak[static_cast<size_t>(MemCategory::Activations)] / 1048576.0
     << "MiB | process peak=" << s.total_peak / 1048576.0 << "MiB";
  if (const uint64_t rss = platform::peak_rss_bytes()) os << " | peak RSS=" << rss / 1048576.0 << "MiB";
  if (!dev_.is_cpu()) os << " | device peak=" << mem_stats(true).total_peak / 1048576.0 << "MiB";
  if (now.pinned > 0) os << " | pinned host=" << now.pinned / 1048576.0 << "MiB";
  // What this process holds now, by category: host memory, device memory (GPU runs), NVMe (where any).
  auto by_category = [&](const char* where, const MemoryNow::ByCategory& v, bool all) {
    os << " | " << where << " now:";
    for (size_t c = 0; c < v.size(); ++c)
      if (all || v[c] > 0)
        os << " " << mem_category_name(static_cast<MemCategory>(c)) << "=" << v[c] / 1048576.0 << "MiB";
  };
  by_category("host", now.host, true);
  if (now.nvme_buffers > 0) os << " nvme_buffers=" << now.nvme_buffers / 1048576.0 << "MiB";
  if (!dev_.is_cpu()) by_category("device", now.device, true);
  if (now.nvme_total() > 0) by_category("NVMe", now.nvme, false);
  return os.str();
}

}  // namespace zerorun
