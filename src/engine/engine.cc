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
  pdev_ = dev_.is_cuda() && stage_ == 3 && cfg_.zero.offload_param.device == "cpu" ? Device::cpu() : dev_;
  ZR_CHECK(!offload_ || stage_ >= 1, "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is 0)");
  ZR_CHECK(pdev_ == dev_ || offload_, "offload_param on a GPU run needs offload_optimizer too");
  mixed_ = cfg_.precision != Precision::FP32;
  // bf16.bf16_master_weights_and_grads: the bf16 compute weights are the master (no fp32 copy), updated in place by
  // the CPU optimizer, which rounds the gradient and the new weights to bf16.
  bf16_master_ = mixed_ && cfg_.bf16_master_weights_and_grads;
  ZR_CHECK(!bf16_master_ || dev_.is_cpu(), "bf16.bf16_master_weights_and_grads / bf16_optimizer_states are ",
           "implemented on CPU ranks only so far (issue 34); this run trains on a GPU");
  seq_len_ = cfg_.train.seq_len;
  if (model_.symbols.count("T")) {
    int64_t maxT = model_.symbols.at("T");
    if (seq_len_ == 0) seq_len_ = maxT;
    ZR_CHECK(seq_len_ <= maxT, "train.seq_len ", seq_len_, " exceeds the model's context of ", maxT);
  }
  std::map<std::string, int64_t> syms = {{"B", cfg_.micro}, {"T", seq_len_ ? seq_len_ : 1}};
  model_.graph.validate(model_.param_shapes(), syms);
  build_layout();
  const int r = comm_.rank();
  be().set_matmul_dtype(precision_dtype(cfg_.precision));

  // Compute parameters (full for stages 0-2, this rank's shard for stage 3), read from the model range by range:
  // each rank reads only what it keeps, into place (host memory) or through a bounded staging buffer (device), so
  // no rank holds more of the model than its share.
  if (stage_ < 3) {
    compute_ = Tensor::zeros({plan_.padded}, DType::F32, MemCategory::Params, dev_);
    for (auto& s : plan_.params) load_weights(s.name, 0, s.numel, compute_, s.offset);
  } else {
    param_shard_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Params, pdev_);
    for (size_t p = 0; p < plan_.params.size(); ++p) {
      const zero::ParamSlot& s = plan_.params[p];
      zero::Range own = plan_.param_owned(static_cast<int>(p), r);
      if (own.empty()) continue;
      int64_t piece = s.offset + own.begin - plan_.owned(s.group, r).begin;
      load_weights(s.name, own.begin, own.size(), param_shard_, shard_off_[static_cast<size_t>(s.group)] + piece);
    }
  }
  // fp32 master: in fp32 the compute weights are the master; with 16-bit
  // compute it is optimizer state, sharded from stage 1 on.
  if ((mixed_ && !bf16_master_) || offload_) {
    if (stage_ == 0) {
      master_ = compute_.clone(MemCategory::Optimizer);
    } else {
      master_ =
          Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Optimizer, offload_ ? Device::cpu() : dev_);
      for (size_t g = 0; g < plan_.groups.size(); ++g) {
        zero::Range own = plan_.owned(static_cast<int>(g), r);
        const float* src = stage_ < 3 ? compute_.f32() + own.begin : param_shard_.f32() + shard_off_[g];
        copy_f32(master_.f32() + shard_off_[g], src, own.size());
      }
    }
  }
  if (mixed_) {
    const DType dt = precision_dtype(cfg_.precision);
    Tensor& c = stage_ < 3 ? compute_ : param_shard_;
    if (stage_ < 3 && dev_.is_cuda() && be().activations16()) {
      // The products' 16-bit weights, kept once instead of rounded by every forward; one pass rounds both copies.
      compute16_ = Tensor::uninit({plan_.padded}, dt, MemCategory::Params, dev_);
      be().round_to16(dt, c.f32(), static_cast<uint16_t*>(compute16_.raw()), c.f32(), c.numel());
    } else {
      kernels::backend(c.device()).round_to(dt, c.f32(), c.f32(), c.numel());
    }
  }
  if (offload_) host_grad_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Grads, Device::cpu());
  if (offload_ && !pdev_.is_cpu()) {
    int64_t most = 0;
    for (const zero::Group& g : plan_.groups) most = std::max(most, g.shard);
    offload_stage_ = Tensor::empty({most}, DType::F32, MemCategory::Buffers, Device::cpu());
  }
  pin_offload_buffers();
  if (stage_ < 2)
    grads_full_ = Tensor::zeros({plan_.padded}, DType::F32, MemCategory::Grads, dev_);
  else
    grads_shard_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Grads, dev_);

  std::map<std::string, Tensor> pv, gv;
  for (auto& s : plan_.params) {
    const Shape& shape = model_.shape(s.name);
    pv[s.name] = stage_ < 3 ? Tensor::view_of(compute_, s.offset, shape) : Tensor();
    gv[s.name] = stage_ < 2 ? Tensor::view_of(grads_full_, s.offset, shape) : Tensor();
  }
  exec_ = std::make_unique<Executor>(model_.graph, pv, gv);
  if (compute16_.defined()) {
    std::map<std::string, Tensor> p16;
    for (auto& s : plan_.params) p16[s.name] = Tensor::view_of(compute16_, s.offset, model_.shape(s.name));
    exec_->set_params16(std::move(p16));
    // Stages 1-2 on several ranks all-gather the 16-bit copy (the f32 copy follows it); offload refreshes the full
    // f32 copy from the host master.
    if (master_.defined() && !offload_) make_compact();
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
  if (stage_ == 3) {
    const int64_t thr = cfg_.zero.stage3_param_persistence_threshold.value_or(0);
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      rt_[g].persistent = plan_.groups[g].numel < thr;
      if (rt_[g].persistent) ensure_live(static_cast<int>(g));
    }
  }
  opt_ = std::make_unique<Optimizer>(cfg_.optimizer, stage_ == 0 ? plan_.padded : plan_.shard_numel(),
                                     offload_ ? Device::cpu() : dev_, bf16_master_,
                                     bf16_master_ && cfg_.bf16_optimizer_states);
  // offload_optimizer "nvme" (ZeRO-Infinity): the CPU optimizer's moments live in a file under nvme_path, streamed
  // in chunks of sub_group_size elements (at most 16M) around each update (src/zero/nvme.cc).
  if (cfg_.zero.offload_optimizer.device == "nvme") {
    ZR_CHECK(stage_ >= 1, "offload_optimizer \"nvme\" needs ZeRO stage 1, 2 or 3 (stage is 0)");
    const OffloadConfig& o = cfg_.zero.offload_optimizer;
    const int64_t chunk = std::min<int64_t>(cfg_.zero.sub_group_size, int64_t{1} << 24);
    opt_->place_on_nvme(o.nvme_path, comm_.rank(), chunk, o.buffer_count, cfg_.aio);
  }
  sched_ = std::make_unique<LrSchedule>(cfg_.scheduler, cfg_.optimizer, total_steps);
  scaler_ = std::make_unique<LossScaler>(cfg_.loss_scale, cfg_.precision == Precision::FP16);
  // CUDA graphs where a micro-batch's work is the same kernels on the same buffers every time: stages 0-1 (no
  // per-bucket collectives or gathers inside the backward), not under the synchronised profiler, not with dropout
  // (its masks change every micro-batch).
  const char* g = std::getenv("ZERORUN_CUDA_GRAPHS");
  use_graphs_ =
      dev_.is_cuda() && stage_ < 2 && !profile::enabled() && !(g && std::strcmp(g, "0") == 0) && !exec_->has_dropout();
  // One GPU, stages 0-1 with graphs and the compact copy: the update runs group by group on a side stream below
  // the main one in priority, so that the next forward's block waits only for its own groups (the backward for
  // all); ZERORUN_OPT_OVERLAP=0 keeps it on the main stream.
  const char* ov = std::getenv("ZERORUN_OPT_OVERLAP");
  overlap_ = use_graphs_ && compact_ && comm_.size() == 1 && !(ov && std::strcmp(ov, "0") == 0);
  if (overlap_) {
    side_ = std::make_unique<cuda::SideStream>(static_cast<int>(plan_.groups.size()) + 1);
    exec_->hooks.before_block_forward = [this](size_t b) {
      for (int grp : block_groups_[b]) side_->main_waits(grp);
    };
  }
}

void Engine::load_weights(const std::string& name, int64_t first, int64_t count, const Tensor& dst, int64_t at) {
  if (dst.device().is_cpu()) {
    model_.read_f32(name, first, count, dst.f32() + at);
    return;
  }
  constexpr int64_t kStage = int64_t{1} << 22;  // 16 MiB of f32 a copy to the device
  std::vector<float> buf(static_cast<size_t>(std::min(count, kStage)));
  for (int64_t done = 0; done < count; done += kStage) {
    const int64_t k = std::min(kStage, count - done);
    model_.read_f32(name, first + done, k, buf.data());
    cuda::copy(dst.f32() + at + done, buf.data(), static_cast<size_t>(k) * sizeof(float));
  }
}

void Engine::pin_offload_buffers() {
  auto pin = [&](const Tensor& t, const char* what) {
    std::string why;
    if (!t.defined() || t.pinned()) return;
    if (t.pin_memory(&why))
      pinned_bytes_ += static_cast<int64_t>(t.nbytes());
    else
      spdlog::warn(
          "rank {}: pin_memory: {} ({:.1f} MiB) could not be page-locked ({}); its copies to and from the "
          "GPU use pageable memory",
          comm_.rank(), what, t.nbytes() / 1048576.0, why);
  };
  if (offload_ && cfg_.zero.offload_optimizer.pin_memory) {
    pin(host_grad_, "the gradient shard");
    pin(offload_stage_, "the update's staging buffer");
  }
  if (pdev_.is_cpu() && dev_.is_cuda() && cfg_.zero.offload_param.pin_memory) pin(param_shard_, "the parameter shard");
}

Engine::~Engine() {
  for (auto& g : rt_)
    if (g.gather) g.gather->wait();
}

void Engine::build_layout() {
  // Buckets (src/zero/layout.cc): consecutive params of one block up to reduce_bucket_size elements (stages 2-3).
  // DeepSpeed allows 0 (a bucket per parameter), as a bucket of 1 element does here (the estimate's rule too).
  const int64_t bucket =
      stage_ >= 2 ? std::max<int64_t>(cfg_.zero.reduce_bucket_size.value_or(std::numeric_limits<int64_t>::max()), 1)
                  : std::numeric_limits<int64_t>::max();
  const auto& blocks = model_.graph.blocks;
  std::vector<zero::ParamUse> uses;
  auto ranges = model_.graph.block_ranges();
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t i = ranges[b].first; i < ranges[b].second; ++i)
      for (auto& [role, name] : model_.graph.nodes[i].params)
        uses.push_back({static_cast<int>(b), name, model_.numel(name)});
  zero::BucketLayout L = zero::bucket_layout(uses, static_cast<int>(blocks.size()), bucket);
  plan_ = zero::plan(L.params, comm_.size(), 1);
  shard_off_.clear();
  int64_t off = 0;
  for (auto& g : plan_.groups) shard_off_.push_back(off), off += g.shard;
  block_groups_ = L.block_groups;
  ready_block_.clear();
  for (int b : L.ready_block) ready_block_.push_back(b < 0 ? blocks.size() : static_cast<size_t>(b));
  rt_.clear();
  rt_.resize(plan_.groups.size());
}

kernels::Backend& Engine::be() const { return kernels::backend(dev_); }

void Engine::copy_f32(float* dst, const float* src, int64_t n) const {
  if (n <= 0) return;
  if (dev_.is_cpu())
    std::copy_n(src, n, dst);
  else
    cuda::copy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

// ---- stage 3 parameter life cycle -----------------------------------------

void Engine::start_gather(int g) {
  GroupRt& s = rt_[static_cast<size_t>(g)];
  if (s.full.defined()) return;  // live or in flight
  const zero::Group& grp = plan_.groups[static_cast<size_t>(g)];
  s.full = Tensor::empty({grp.padded}, DType::F32, MemCategory::Params, dev_);
  const float* src = param_shard_.f32() + shard_off_[static_cast<size_t>(g)];
  if (param_shard_.device() != dev_) {  // offload_param: stream the host shard in first
    s.staged = Tensor::empty({grp.shard}, DType::F32, MemCategory::Buffers, dev_);
    copy_f32(s.staged.f32(), src, grp.shard);
    src = s.staged.f32();
  }
  s.gather = comm_.all_gather_async(src, s.full.f32(), grp.shard, DType::F32);
}

void Engine::ensure_live(int g) {
  GroupRt& s = rt_[static_cast<size_t>(g)];
  bool bound = s.full.defined() && !s.gather;
  start_gather(g);
  if (s.gather) {
    s.gather->wait();
    s.gather.reset();
    s.staged = Tensor();
  }
  if (!bound) bind_params(g, true);
}

void Engine::release(int g) {
  GroupRt& s = rt_[static_cast<size_t>(g)];
  if (s.persistent || !s.full.defined()) return;
  if (s.gather) s.gather->wait(), s.gather.reset();
  bind_params(g, false);
  s.full = Tensor();
}

void Engine::bind_params(int g, bool live) {
  const zero::Group& grp = plan_.groups[static_cast<size_t>(g)];
  for (int p : grp.params) {
    const zero::ParamSlot& s = plan_.params[static_cast<size_t>(p)];
    exec_->set_param(
        s.name, live ? Tensor::view_of(rt_[static_cast<size_t>(g)].full, s.offset - grp.offset, model_.shape(s.name))
                     : Tensor());
  }
}

void Engine::on_block(size_t b, bool forward, bool before) {
  const size_t nb = block_groups_.size();
  if (stage_ == 3) {
    if (before) {
      for (int g : block_groups_[b]) ensure_live(g);
      // Prefetch the next block in execution order within the budgets.
      size_t nxt = forward ? b + 1 : b - 1;
      if ((forward && b + 1 < nb) || (!forward && b > 0)) {
        int64_t budget = cfg_.zero.stage3_prefetch_bucket_size.value_or(0), live = 0;
        for (auto& s : rt_)
          if (s.full.defined()) live += s.full.numel();
        for (int g : block_groups_[nxt]) {
          int64_t n = plan_.groups[static_cast<size_t>(g)].padded;
          if (rt_[static_cast<size_t>(g)].full.defined()) continue;
          if (n > budget || live + n > cfg_.zero.stage3_max_live_parameters) break;
          start_gather(g);
          budget -= n;
          live += n;
        }
      }
    } else {
      // Free what the next block in execution order does not need (the last
      // block's params stay for its backward, which follows at once).
      bool last_fwd = forward && b + 1 == nb;
      if (!last_fwd) {
        const std::vector<int>* nxt = nullptr;
        if (forward) nxt = &block_groups_[b + 1];
        if (!forward && b > 0) nxt = &block_groups_[b - 1];
        for (int g : block_groups_[b])
          if (!nxt || std::find(nxt->begin(), nxt->end(), g) == nxt->end()) release(g);
      }
    }
  }
  if (!forward && before) begin_grads(b);
  if (!forward && !before) finish_grads(b);
}

// ---- stage 2/3 gradient buckets ---------------------------------------------

void Engine::begin_grads(size_t b) {
  for (int g : block_groups_[b]) {
    GroupRt& s = rt_[static_cast<size_t>(g)];
    if (s.work_grad.defined()) continue;
    const zero::Group& grp = plan_.groups[static_cast<size_t>(g)];
    s.work_grad = Tensor::zeros({grp.padded}, DType::F32, MemCategory::Grads, dev_);
    for (int p : grp.params) {
      const zero::ParamSlot& ps = plan_.params[static_cast<size_t>(p)];
      exec_->set_grad(ps.name, Tensor::view_of(s.work_grad, ps.offset - grp.offset, model_.shape(ps.name)));
    }
  }
}

void Engine::finish_grads(size_t b) {
  for (int g : block_groups_[b]) {
    if (ready_block_[static_cast<size_t>(g)] != b) continue;
    GroupRt& s = rt_[static_cast<size_t>(g)];
    const zero::Group& grp = plan_.groups[static_cast<size_t>(g)];
    profile::Scope ps("reduce_scatter grads");
    Tensor mine = Tensor::empty({grp.shard}, DType::F32, MemCategory::Grads, dev_);
    comm_.reduce_scatter(s.work_grad.f32(), mine.f32(), grp.shard, DType::F32);
    be().accumulate(grads_shard_.f32() + shard_off_[static_cast<size_t>(g)], mine.f32(), grp.shard);
    for (int p : grp.params) exec_->set_grad(plan_.params[static_cast<size_t>(p)].name, Tensor());
    s.work_grad = Tensor();
  }
}

// ---- the step -----------------------------------------------------------------

// d(loss) announced before the forward (the loss op can make its input's gradient there); `fresh`: this backward
// overwrites the gradient buffer. Returns the loss, not yet read.
Tensor Engine::forward_backward(const std::map<std::string, Tensor>& inputs, bool fresh, float loss_grad) {
  exec_->set_next_loss_grad(loss_grad);
  if (fresh) exec_->mark_grads_fresh();
  Tensor loss = exec_->forward_async(inputs);
  if (overlap_) side_->main_waits(static_cast<int>(plan_.groups.size()));  // the update read these gradients
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
  if (side_) side_->main_waits(static_cast<int>(plan_.groups.size()));
}

float* Engine::owned_master(int g) {
  if (master_.defined()) return master_.f32() + shard_off_[static_cast<size_t>(g)];
  if (stage_ < 3) return compute_.f32() + plan_.owned(g, comm_.rank()).begin;
  return param_shard_.f32() + shard_off_[static_cast<size_t>(g)];
}

void Engine::gather_after_step(bool rounded) {
  if (!rounded) refresh_compute_params();
  if (gathers16()) {  // each rank's updated piece: written with the update, or rounded from the master here
    if (!rounded) sync_compute16();
    gather16();
    return;
  }
  const int W = comm_.size();
  const bool sharded12 = (stage_ == 1 || stage_ == 2) && W > 1;
  if (sharded12) {
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      const zero::Group& grp = plan_.groups[g];
      zero::Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      Tensor mine = Tensor::empty({grp.shard}, DType::F32, MemCategory::Buffers, dev_);
      copy_f32(mine.f32(), compute_.f32() + own.begin, grp.shard);
      comm_.all_gather(mine.f32(), compute_.f32() + grp.offset, grp.shard, DType::F32);
    }
  } else if (stage_ == 3) {
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      if (!rt_[g].persistent) continue;
      const zero::Group& grp = plan_.groups[g];
      comm_.all_gather(param_shard_.f32() + shard_off_[g], rt_[g].full.f32(), grp.shard, DType::F32);
    }
  }
  // The 16-bit copy: written with the update where it covered everything, else rounded from compute_.
  if (!rounded || sharded12) sync_compute16();
}

// The pieces gathered in 16 bits (half the bytes of f32) and the compact f32 copy widened from them.
void Engine::gather16() {
  const DType dt = precision_dtype(cfg_.precision);
  uint16_t* h = static_cast<uint16_t*>(compute16_.raw());
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    const zero::Group& grp = plan_.groups[g];
    zero::Range own = plan_.owned(static_cast<int>(g), comm_.rank());
    Tensor mine = Tensor::empty({grp.shard}, dt, MemCategory::Buffers, dev_);
    mine.copy_from(Tensor::view_of(compute16_, own.begin, {grp.shard}));
    comm_.all_gather(mine.raw(), h + grp.offset, grp.shard, dt);
  }
  be().widen16_slots(dt, h, compute_.f32(), plan_.padded, f32_slots_.i32());
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
  if (stage_ == 3)  // the forward leaves the last block gathered for a backward that does not come
    for (size_t g = 0; g < rt_.size(); ++g) {
      release(static_cast<int>(g));  // persistent groups stay
      if (!rt_[g].persistent) rt_[g].staged = Tensor();
    }
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
  Tensor& gbuf = stage_ < 2 ? grads_full_ : grads_shard_;
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
        opt_->step(mixed_ ? master_.f32() : compute_.f32(), g, lm.lr, beta1, rounded_out(0));
      } else {  // group by group: this rank's shards (stages 1-3), or every group on the side stream (overlap_)
        std::optional<cuda::SideStream::Scope> on;
        if (overlap_) side_->after_main(), on.emplace(*side_);  // after the (clipped) gradients
        const int n = static_cast<int>(plan_.groups.size());
        opt_->begin_step();
        for (int gi = 0; gi < n; ++gi) {
          zero::Range own = plan_.owned(gi, r);
          const float* gr = stage_ < 2 ? g + own.begin : g + shard_off_[static_cast<size_t>(gi)];
          if (offload_) {  // gradient shard to host, CPU optimizer on the host master
            copy_f32(host_grad_.f32() + shard_off_[static_cast<size_t>(gi)], gr, own.size());
            gr = host_grad_.f32() + shard_off_[static_cast<size_t>(gi)];
          }
          // Stage 0 (overlap_, one rank): the full master and optimizer state, in the flat layout.
          float* p = stage_ == 0 ? master_.f32() + own.begin : owned_master(gi);
          const int64_t state = stage_ == 0 ? own.begin : shard_off_[static_cast<size_t>(gi)];
          opt_->update(p, gr, state, own.size(), lm.lr, beta1, rounded_out(own.begin));
          if (overlap_) side_->record(gi);
        }
        if (overlap_) side_->record(n);
      }
    }
    st.lr = lm.lr;
    ++updates_;
    {
      profile::Scope ps("refresh+gather params");
      gather_after_step(rounded_out(0).f32 != nullptr);
    }
    st.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
    if (opt_->nvme()) st.nvme_wait_seconds = opt_->nvme()->wait_seconds() - nvme_wait0;
  }
  // Stages 2-3 accumulate each step's reduced shards; a skipped step's non-finite values are cleared as well
  // (stages 0-1 otherwise overwrite the buffer in the next backward; its padding is never written).
  if (stage_ >= 2 || st.skipped) gbuf.zero_();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.tokens = cfg_.batch * data.tokens_per_sample();
  return st;
}

std::map<std::string, Tensor> Engine::master_weights() {
  settle();
  std::map<std::string, Tensor> r;
  auto slice = [&](const float* group_base, const zero::Group& grp) {
    for (int p : grp.params) {
      const zero::ParamSlot& s = plan_.params[static_cast<size_t>(p)];
      Tensor t = Tensor::empty(model_.shape(s.name), DType::F32, MemCategory::Buffers);
      copy_f32(t.f32(), group_base + (s.offset - grp.offset), s.numel);
      r[s.name] = t;
    }
  };
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    const zero::Group& grp = plan_.groups[g];
    if (stage_ == 0) {
      slice((mixed_ ? master_.f32() : compute_.f32()) + grp.offset, grp);
      continue;
    }
    Tensor full =
        Tensor::empty({grp.padded}, DType::F32, MemCategory::Buffers, master_.defined() ? master_.device() : dev_);
    comm_.all_gather(owned_master(static_cast<int>(g)), full.f32(), grp.shard, DType::F32);
    slice(full.f32(), grp);
  }
  return r;
}

ModelStateBytes Engine::model_state_bytes() const {
  ModelStateBytes b;
  b.params = static_cast<int64_t>(compute_.defined() ? compute_.nbytes() : param_shard_.nbytes());
  if (compute16_.defined()) b.params += static_cast<int64_t>(compute16_.nbytes());
  for (auto& s : rt_)
    if (s.persistent && s.full.defined()) b.params += static_cast<int64_t>(s.full.nbytes());
  b.grads = static_cast<int64_t>(grads_full_.defined() ? grads_full_.nbytes() : grads_shard_.nbytes()) +
            static_cast<int64_t>(host_grad_.defined() ? host_grad_.nbytes() : 0);
  b.optimizer = static_cast<int64_t>(master_.defined() ? master_.nbytes() : 0) + opt_->ram_bytes();
  return b;
}

std::string Engine::optimizer_report() const {
  std::ostringstream os;
  os.precision(3);
  const bool bf16_states = bf16_master_ && cfg_.bf16_optimizer_states;
  const bool host = dev_.is_cpu() || offload_;
  os << std::fixed << "optimizer states in " << (host ? "host RAM" : "device memory") << ": master=";
  if (master_.defined())
    os << master_.nbytes() / 1048576.0 << "MiB (fp32)";
  else
    os << (bf16_master_ ? "the bf16 compute weights" : "the fp32 compute weights");
  if (opt_->nvme())
    os << " moments on NVMe=" << opt_->nvme_bytes() / 1048576.0 << "MiB (" << (bf16_states ? "bf16" : "f32") << ", "
       << opt_->nvme()->path()
       << (opt_->nvme()->direct() ? ", O_DIRECT" : ", buffered: the filesystem refused O_DIRECT")
       << "; buffers in RAM=" << opt_->nvme()->buffer_bytes() / 1048576.0 << "MiB)";
  else
    os << " moments=" << opt_->ram_bytes() / 1048576.0 << "MiB (" << (bf16_states ? "bf16" : "f32") << ")";
  return os.str();
}

std::string Engine::memory_report() const {
  ModelStateBytes b = model_state_bytes();
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
  if (pinned_bytes_ > 0) os << " | pinned host=" << pinned_bytes_ / 1048576.0 << "MiB";
  return os.str();
}

}  // namespace zerorun
