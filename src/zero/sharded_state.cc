// ShardedState's buffers: the layout, where each flat buffer lives and how this rank's weights are read into it,
// the views handed to the computation, the optimizer's pieces and the ranges checkpoints read and write. The
// stage-3 life cycle, the gradient buckets and the compute copies have files of their own.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "kernels/backend.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/zero_state.h"

namespace zerorun::zero {

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::Device:
      return "device";
    case Placement::Host:
      return "host";
    case Placement::PinnedHost:
      return "pinned host";
    case Placement::Nvme:
      return "nvme";
  }
  return "?";
}

ShardedState::ShardedState(const std::vector<ParamUse>& uses, int num_blocks,
                           const std::map<std::string, Shape>& shapes, const StateOptions& o, Communicator& comm,
                           const WeightReader& read)
    : o_(o), comm_(comm), dev_(o.device), shapes_(shapes) {
  const int stage = o_.stage;
  ZR_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3, got ", stage);
  ZR_CHECK(!o_.offload_optimizer || (dev_.is_cuda() && stage >= 1),
           "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is ", stage, ") on a GPU run");
  pdev_ = dev_.is_cuda() && stage == 3 && o_.offload_param ? Device::cpu() : dev_;
  ZR_CHECK(pdev_ == dev_ || o_.offload_optimizer, "offload_param on a GPU run needs offload_optimizer too");
  ZR_CHECK(o_.param_nvme_path.empty() || (stage == 3 && pdev_.is_cpu()),
           "offload_param \"nvme\" needs ZeRO stage 3 (stage is ", stage, ") and, on a GPU run, offload_param");
  const bool mixed = this->mixed();
  ZR_CHECK(!o_.bf16_master || mixed, "bf16 master weights need 16-bit compute");

  // Buckets (src/zero/layout.cc): consecutive params of one block up to `bucket` elements (stages 2-3).
  const int64_t bucket = stage >= 2 ? std::max<int64_t>(o_.bucket, 1) : std::numeric_limits<int64_t>::max();
  BucketLayout L = bucket_layout(uses, num_blocks, bucket);
  plan_ = zero::plan(L.params, comm_.size(), 1);
  int64_t off = 0;
  for (auto& g : plan_.groups) shard_off_.push_back(off), off += g.shard;
  block_groups_ = L.block_groups;
  for (int b : L.ready_block) ready_block_.push_back(b < 0 ? static_cast<size_t>(num_blocks) : static_cast<size_t>(b));
  rt_.resize(plan_.groups.size());
  for (auto& s : plan_.params) ZR_CHECK(shapes_.count(s.name), "sharded state: no shape for parameter '", s.name, "'");
  const int r = comm_.rank();

  // Compute parameters (full for stages 0-2, this rank's shard for stage 3), read range by range: each rank reads
  // only what it keeps, into place (host memory) or through a bounded staging buffer (device), so no rank holds
  // more of the model than its share.
  // fp32 master: in fp32 the compute weights are the master; with 16-bit compute it is optimizer state, sharded
  // from stage 1 on.
  const bool keep_master = (mixed && !o_.bf16_master) || o_.offload_optimizer;
  if (stage < 3) {
    compute_ = Tensor::zeros({plan_.padded}, DType::F32, MemCategory::Params, dev_);
    for (auto& s : plan_.params) load_weights(read, s.name, 0, s.numel, compute_, s.offset);
  } else {
    // offload_param "nvme": the groups past the first max_in_cpu elements of the shard go to a file.
    int64_t in_ram = plan_.shard_numel();
    if (!o_.param_nvme_path.empty()) {
      int first = 0;
      const int ng = static_cast<int>(plan_.groups.size());
      while (first < ng && shard_off_[static_cast<size_t>(first)] + plan_.groups[static_cast<size_t>(first)].shard <=
                               o_.param_max_in_cpu)
        ++first;
      if (first < ng) {
        first_nvme_group_ = first;
        nvme_base_ = in_ram = shard_off_[static_cast<size_t>(first)];
        param_nvme_ =
            std::make_unique<NvmeStates>(o_.param_nvme_path, r, "parameters.bin", plan_.shard_numel() - in_ram, 1, 4,
                                         o_.param_nvme_chunk, o_.param_nvme_buffers, o_.aio);
      }
    }
    param_shard_ = Tensor::zeros({in_ram}, DType::F32, MemCategory::Params, pdev_);
    if (keep_master)
      master_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Optimizer,
                              o_.offload_optimizer ? Device::cpu() : dev_);
    // Group by group, each piece handled once (an NVMe piece read from the model, never from its fresh file, and
    // written once): its weights read in, copied to the master, rounded to the compute dtype.
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      const int gi = static_cast<int>(g);
      const bool nvme = piece_on_nvme(gi);
      float* w = shard_piece(gi, false);
      for (int p : plan_.groups[g].params) {
        const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
        Range own = plan_.param_owned(p, r);
        if (own.empty()) continue;
        int64_t piece = s.offset + own.begin - plan_.owned(gi, r).begin;
        load_weights(read, s.name, own.begin, own.size(), nvme ? rt_[g].window : param_shard_,
                     (nvme ? 0 : shard_off_[g]) + piece);
      }
      const int64_t n = plan_.owned(gi, r).size();
      if (keep_master) copy_f32(master_.f32() + shard_off_[g], w, n);
      if (mixed) kernels::backend(nvme ? Device::cpu() : pdev_).round_to(o_.compute_dtype, w, w, n);
      put_piece(gi, true);
    }
  }
  if (keep_master && stage < 3) {
    if (stage == 0) {
      master_ = compute_.clone(MemCategory::Optimizer);
    } else {
      master_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Optimizer,
                              o_.offload_optimizer ? Device::cpu() : dev_);
      for (size_t g = 0; g < plan_.groups.size(); ++g) {
        Range own = plan_.owned(static_cast<int>(g), r);
        copy_f32(master_.f32() + shard_off_[g], compute_.f32() + own.begin, own.size());
      }
    }
  }
  // bf16 master weights with offload (GPU runs): the host master holds the bf16 weights the compute copies get.
  if (o_.bf16_master && master_.defined())
    kernels::cpu_backend().round_to(DType::BF16, master_.f32(), master_.f32(), master_.numel());
  if (mixed && stage < 3) {
    const DType dt = o_.compute_dtype;
    Tensor& c = compute_;
    kernels::Backend& be = kernels::backend(dev_);
    if (dev_.is_cuda() && be.activations16()) {
      // The products' 16-bit weights, kept once instead of rounded by every forward; one pass rounds both copies.
      compute16_ = Tensor::uninit({plan_.padded}, dt, MemCategory::Params, dev_);
      be.round_to16(dt, c.f32(), static_cast<uint16_t*>(compute16_.raw()), c.f32(), c.numel());
    } else {
      kernels::backend(c.device()).round_to(dt, c.f32(), c.f32(), c.numel());
    }
  }
  if (o_.offload_optimizer)
    host_grad_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Grads, Device::cpu());
  if (o_.offload_optimizer && !pdev_.is_cpu()) {
    int64_t most = 0;
    for (const Group& g : plan_.groups) most = std::max(most, g.shard);
    offload_stage_ = Tensor::empty({most}, DType::F32, MemCategory::Buffers, Device::cpu());
  }
  pin_offload_buffers();
  if (stage < 2)
    grads_full_ = Tensor::zeros({plan_.padded}, DType::F32, MemCategory::Grads, dev_);
  else
    grads_shard_ = Tensor::zeros({plan_.shard_numel()}, DType::F32, MemCategory::Grads, dev_);
  if (stage == 3)
    for (size_t g = 0; g < plan_.groups.size(); ++g)
      rt_[g].persistent = plan_.groups[g].numel < o_.persistence_threshold;
}

ShardedState::~ShardedState() {
  for (auto& g : rt_)
    if (g.gather) g.gather->wait();
}

void ShardedState::load_weights(const WeightReader& read, const std::string& name, int64_t first, int64_t count,
                                const Tensor& dst, int64_t at) {
  if (dst.device().is_cpu()) {
    read(name, first, count, dst.f32() + at);
    return;
  }
  constexpr int64_t kStage = int64_t{1} << 22;  // 16 MiB of f32 a copy to the device
  std::vector<float> buf(static_cast<size_t>(std::min(count, kStage)));
  for (int64_t done = 0; done < count; done += kStage) {
    const int64_t k = std::min(kStage, count - done);
    read(name, first + done, k, buf.data());
    cuda::copy(dst.f32() + at + done, buf.data(), static_cast<size_t>(k) * sizeof(float));
  }
}

void ShardedState::pin_offload_buffers() {
  auto pin = [&](const Tensor& t, const char* what) {
    std::string why;
    if (!t.defined() || t.pinned() || t.nbytes() == 0) return;  // (offload_param nvme: all of the shard on disk)
    if (t.pin_memory(&why))
      pinned_bytes_ += static_cast<int64_t>(t.nbytes());
    else
      spdlog::warn(
          "rank {}: pin_memory: {} ({:.1f} MiB) could not be page-locked ({}); its copies to and from the "
          "GPU use pageable memory",
          comm_.rank(), what, t.nbytes() / 1048576.0, why);
  };
  if (o_.offload_optimizer && o_.pin_optimizer) {
    pin(host_grad_, "the gradient shard");
    pin(offload_stage_, "the update's staging buffer");
  }
  if (pdev_.is_cpu() && dev_.is_cuda() && o_.pin_param) pin(param_shard_, "the parameter shard");
}

void ShardedState::copy_timed(float* dst, const float* src, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  copy_f32(dst, src, n);
  transfer_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedState::copy_f32(float* dst, const float* src, int64_t n) const {
  if (n <= 0) return;
  if (dev_.is_cpu())
    std::copy_n(src, n, dst);
  else
    cuda::copy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

std::vector<BufferInfo> ShardedState::buffers() const {
  std::vector<BufferInfo> out;
  auto add = [&](const char* name, const Tensor& t, MemCategory c) {
    if (!t.defined()) return;
    const Placement p = t.device().is_cuda() ? Placement::Device : t.pinned() ? Placement::PinnedHost : Placement::Host;
    out.push_back({name, p, static_cast<int64_t>(t.nbytes()), c});
  };
  add("compute", compute_, MemCategory::Params);
  add("compute16", compute16_, MemCategory::Params);
  add("param_shard", param_shard_, MemCategory::Params);
  add("master", master_, MemCategory::Optimizer);
  add("grads", grads(), MemCategory::Grads);
  add("host_grad", host_grad_, MemCategory::Grads);
  add("offload_stage", offload_stage_, MemCategory::Buffers);
  if (param_nvme_) out.push_back({"param_shard", Placement::Nvme, param_nvme_bytes(), MemCategory::Params});
  if (moments_) {
    const int64_t bytes = moments_->nvme() ? moments_->nvme_bytes() : moments_->ram_bytes();
    out.push_back({"moments", moments_->placement(), bytes, MemCategory::Optimizer});
  }
  return out;
}

int64_t ShardedState::param_bytes() const {
  int64_t b = static_cast<int64_t>(compute_.defined() ? compute_.nbytes() : param_shard_.nbytes());
  if (compute16_.defined()) b += static_cast<int64_t>(compute16_.nbytes());
  for (auto& s : rt_)
    if (s.persistent && s.full.defined()) b += static_cast<int64_t>(s.full.nbytes());
  return b;
}

int64_t ShardedState::param_nvme_bytes() const {
  return param_nvme_ ? (plan_.shard_numel() - nvme_base_) * static_cast<int64_t>(sizeof(float)) : 0;
}

int64_t ShardedState::grad_bytes() const {
  return static_cast<int64_t>(grads_full_.defined() ? grads_full_.nbytes() : grads_shard_.nbytes()) +
         static_cast<int64_t>(host_grad_.defined() ? host_grad_.nbytes() : 0);
}

// ---- views ------------------------------------------------------------------------

std::map<std::string, Tensor> ShardedState::param_views() const {
  std::map<std::string, Tensor> v;
  for (auto& s : plan_.params)
    v[s.name] = o_.stage < 3 ? Tensor::view_of(compute_, s.offset, shapes_.at(s.name)) : Tensor();
  return v;
}

std::map<std::string, Tensor> ShardedState::grad_views() const {
  std::map<std::string, Tensor> v;
  for (auto& s : plan_.params)
    v[s.name] = o_.stage < 2 ? Tensor::view_of(grads_full_, s.offset, shapes_.at(s.name)) : Tensor();
  return v;
}

std::map<std::string, Tensor> ShardedState::param16_views() const {
  std::map<std::string, Tensor> v;
  if (compute16_.defined())
    for (auto& s : plan_.params) v[s.name] = Tensor::view_of(compute16_, s.offset, shapes_.at(s.name));
  return v;
}

void ShardedState::bind(Binding b) {
  bind_ = std::move(b);
  for (size_t g = 0; g < rt_.size(); ++g)
    if (rt_[g].persistent) ensure_live(static_cast<int>(g));
}

// ---- the update ------------------------------------------------------------------

MomentStore& ShardedState::make_moments(int arrays, DType dt) {
  const int64_t n = o_.stage == 0 ? plan_.padded : plan_.shard_numel();
  moments_ = std::make_unique<MomentStore>(n, arrays, dt, o_.offload_optimizer ? Device::cpu() : dev_);
  return *moments_;
}

float* ShardedState::full_master() { return mixed() ? master_.f32() : compute_.f32(); }

float* ShardedState::owned_master(int g) {
  if (master_.defined()) return master_.f32() + shard_off_[static_cast<size_t>(g)];
  if (o_.stage < 3) return compute_.f32() + plan_.owned(g, comm_.rank()).begin;
  return shard_piece(g);
}

void ShardedState::done_master(int g, bool dirty) {
  if (!master_.defined() && o_.stage == 3) put_piece(g, dirty);
}

float* ShardedState::shard_piece(int g, bool read) {
  const size_t gi = static_cast<size_t>(g);
  if (!piece_on_nvme(g)) return param_shard_.f32() + shard_off_[gi];
  GroupRt& s = rt_[gi];
  if (s.window_users++ == 0 && !s.window.defined()) {
    const int64_t n = plan_.groups[gi].shard;
    s.window = Tensor::zeros({n}, DType::F32, MemCategory::Buffers, Device::cpu());
    if (read) param_nvme_->read(0, shard_off_[gi] - nvme_base_, n, s.window.f32());
  }
  return s.window.f32();
}

void ShardedState::put_piece(int g, bool dirty) {
  if (!piece_on_nvme(g)) return;
  const size_t gi = static_cast<size_t>(g);
  GroupRt& s = rt_[gi];
  ZR_CHECK(s.window_users > 0, "sharded state: parameter piece ", g, " put back more often than taken");
  s.window_dirty = s.window_dirty || dirty;
  if (--s.window_users > 0) return;
  if (s.window_dirty) param_nvme_->write(0, shard_off_[gi] - nvme_base_, plan_.groups[gi].shard, s.window.f32());
  s.window = Tensor();
  s.window_dirty = false;
}

const float* ShardedState::gather_source(int g, Tensor& staged) {
  const size_t gi = static_cast<size_t>(g);
  const int64_t n = plan_.groups[gi].shard;
  const float* src = param_shard_.defined() && !piece_on_nvme(g) ? param_shard_.f32() + shard_off_[gi] : nullptr;
  if (piece_on_nvme(g)) {  // from the file (or a window in use), into host memory
    Tensor h = Tensor::empty({n}, DType::F32, MemCategory::Buffers, Device::cpu());
    if (rt_[gi].window.defined())
      std::copy_n(rt_[gi].window.f32(), n, h.f32());
    else
      param_nvme_->read(0, shard_off_[gi] - nvme_base_, n, h.f32());
    if (dev_.is_cpu()) {
      staged = h;
      return staged.f32();
    }
    src = h.f32();
    staged = Tensor::empty({n}, DType::F32, MemCategory::Buffers, dev_);
    copy_timed(staged.f32(), src, n);
    return staged.f32();
  }
  if (param_shard_.device() == dev_) return src;
  staged = Tensor::empty({n}, DType::F32, MemCategory::Buffers, dev_);  // offload_param: the host shard streamed in
  copy_timed(staged.f32(), src, n);
  return staged.f32();
}

UpdatePiece ShardedState::update_piece(int g) {
  const size_t gi = static_cast<size_t>(g);
  const Range own = plan_.owned(g, comm_.rank());
  const float* gbase = grads().f32();
  UpdatePiece u;
  u.grads = o_.stage < 2 ? gbase + own.begin : gbase + shard_off_[gi];
  if (o_.offload_optimizer) {  // gradient shard to host, CPU optimizer on the host master
    copy_timed(host_grad_.f32() + shard_off_[gi], u.grads, own.size());
    u.grads = host_grad_.f32() + shard_off_[gi];
  }
  // Stage 0 (one rank, group by group): the full master and optimizer state, in the flat layout.
  u.weights = o_.stage == 0 ? master_.f32() + own.begin : owned_master(g);  // end_update_piece releases it
  u.state_offset = o_.stage == 0 ? own.begin : shard_off_[gi];
  u.flat_begin = own.begin;
  u.n = own.size();
  return u;
}

void ShardedState::end_update_piece(int g) {
  if (o_.stage != 0) done_master(g, true);
}

std::map<std::string, Tensor> ShardedState::full_master_weights() {
  std::map<std::string, Tensor> r;
  auto slice = [&](const float* group_base, const Group& grp) {
    for (int p : grp.params) {
      const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
      Tensor t = Tensor::empty(shapes_.at(s.name), DType::F32, MemCategory::Buffers);
      copy_f32(t.f32(), group_base + (s.offset - grp.offset), s.numel);
      r[s.name] = t;
    }
  };
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    const Group& grp = plan_.groups[g];
    if (o_.stage == 0) {
      slice(full_master() + grp.offset, grp);
      continue;
    }
    Tensor full =
        Tensor::empty({grp.padded}, DType::F32, MemCategory::Buffers, master_.defined() ? master_.device() : dev_);
    comm_.all_gather(owned_master(static_cast<int>(g)), full.f32(), grp.shard, DType::F32);
    done_master(static_cast<int>(g), false);
    slice(full.f32(), grp);
  }
  return r;
}

// ---- checkpoint ranges -----------------------------------------------------------

Range ShardedState::ckpt_range(int p, int rank) const {
  const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
  if (o_.stage == 0) return rank == 0 ? Range{0, s.numel} : Range{0, 0};
  return plan_.param_owned(p, rank);
}

Range ShardedState::own_range(int p) const {
  return o_.stage == 0 ? Range{0, plan_.params[static_cast<size_t>(p)].numel} : plan_.param_owned(p, comm_.rank());
}

// Everything at stages 0-2 where the rank keeps a full f32 compute copy (every rank computes with all of them), else
// (stage 3; stages 1-2 whose 16-bit copy is all-gathered after the load) the rank's own shard.
Range ShardedState::load_range(int p) const {
  return o_.stage == 3 || (o_.stage > 0 && compact_) ? plan_.param_owned(p, comm_.rank())
                                                     : Range{0, plan_.params[static_cast<size_t>(p)].numel};
}

void ShardedState::piece_io(int g, int64_t at, int64_t n, float* buf, bool write) {
  const size_t gi = static_cast<size_t>(g);
  if (piece_on_nvme(g) && !rt_[gi].window.defined()) {  // straight from / to the file: just these elements
    const int64_t off = shard_off_[gi] - nvme_base_ + at;
    return write ? param_nvme_->write(0, off, n, buf) : param_nvme_->read(0, off, n, buf);
  }
  float* piece = shard_piece(g) + at;
  write ? copy_f32(piece, buf, n) : copy_f32(buf, piece, n);
  put_piece(g, write);
}

void ShardedState::read_master(int p, Range r, float* dst) {
  const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
  const int64_t pos = s.offset + r.begin;
  if (o_.stage == 0) return copy_f32(dst, full_master() + pos, r.size());
  const int64_t at = pos - plan_.owned(s.group, comm_.rank()).begin;
  if (!master_.defined() && o_.stage == 3) return piece_io(s.group, at, r.size(), dst, false);
  copy_f32(dst, owned_master(s.group) + at, r.size());
  done_master(s.group, false);
}

int64_t ShardedState::state_offset(int p, int64_t elem) const {
  const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
  const int64_t pos = s.offset + elem;
  return o_.stage == 0 ? pos
                       : shard_off_[static_cast<size_t>(s.group)] + (pos - plan_.owned(s.group, comm_.rank()).begin);
}

void ShardedState::load_master(int p, Range need, std::vector<float> v) {
  const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
  ZR_CHECK(static_cast<int64_t>(v.size()) == need.size(), "load_master: ", v.size(), " values for ", need.size(),
           " elements of '", s.name, "'");
  // compact: sync_compute16 (after_load) writes the compute copies from the master. Stage 3 without a separate
  // master: the master's write below is this copy's (need = own there), the values it would hold included.
  if (!compact_ && (o_.stage < 3 || master_.defined())) {
    std::vector<float> c(v.size());
    for (size_t i = 0; i < v.size(); ++i) c[i] = mixed() ? round_to(o_.compute_dtype, v[i]) : v[i];
    if (o_.stage < 3)
      copy_f32(compute_.f32() + s.offset + need.begin, c.data(), need.size());
    else
      piece_io(s.group, s.offset + need.begin - plan_.owned(s.group, comm_.rank()).begin, need.size(), c.data(), true);
  }
  // After the compute copy: in fp32 the master may alias it. `own` lies inside `need`.
  // bf16 master weights: the master is the compute copy, bf16 values (an fp32-master checkpoint rounded).
  if (o_.bf16_master)
    for (float& x : v) x = round_to(DType::BF16, x);
  const Range own = own_range(p);
  if (own.empty()) return;
  const int64_t pos = s.offset + own.begin;
  const float* src = v.data() + (own.begin - need.begin);
  if (o_.stage == 0) return copy_f32(full_master() + pos, src, own.size());
  const int64_t at = pos - plan_.owned(s.group, comm_.rank()).begin;
  if (!master_.defined() && o_.stage == 3)
    return piece_io(s.group, at, own.size(), v.data() + (own.begin - need.begin), true);
  copy_f32(owned_master(s.group) + at, src, own.size());
  done_master(s.group, true);
}

void ShardedState::after_load() {
  if (o_.stage == 3)
    for (size_t g = 0; g < rt_.size(); ++g)
      if (rt_[g].persistent) {
        Tensor staged;
        comm_.all_gather(gather_source(static_cast<int>(g), staged), rt_[g].full.f32(), plan_.groups[g].shard,
                         DType::F32);
      }
  // The products' 16-bit copy of the loaded weights (where it goes round, each rank rounds its own piece).
  sync_compute16();
  if (gathers16()) gather16();
}

}  // namespace zerorun::zero
