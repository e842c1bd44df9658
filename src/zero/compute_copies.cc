// ShardedState's compute copies of the weights (stages 0-2: full; 16-bit runs: rounded copies of the fp32 master,
// one in 16 bits for the products and one in f32 for the ops that read f32 values, compact where it can be) and
// how an update or a load refreshes and gathers them.
#include <algorithm>
#include <vector>

#include "kernels/backend.h"
#include "zerorun/zero_state.h"

namespace zerorun::zero {

void ShardedState::make_compact(const std::function<bool(const std::string&)>& reads_f32) {
  if (!compute16_.defined()) return;
  const int64_t chunks = (plan_.padded + 255) / 256;
  std::vector<int32_t> slot(static_cast<size_t>(chunks), -1);
  for (auto& s : plan_.params)
    if (s.numel > 0 && reads_f32(s.name))
      for (int64_t k = s.offset / 256; k <= (s.offset + s.numel - 1) / 256; ++k) slot[static_cast<size_t>(k)] = 0;
  int32_t next = 0;
  for (auto& k : slot)
    if (k == 0) k = next++;
  Tensor c = Tensor::zeros({int64_t{next} * 256}, DType::F32, MemCategory::Params, dev_);
  for (int64_t k = 0; k < chunks;) {  // runs of kept chunks, one copy each
    if (slot[static_cast<size_t>(k)] < 0) {
      ++k;
      continue;
    }
    int64_t e = k;
    while (e < chunks && slot[static_cast<size_t>(e)] >= 0) ++e;
    copy_f32(c.f32() + 256 * int64_t{slot[static_cast<size_t>(k)]}, compute_.f32() + 256 * k,
             std::min(256 * e, plan_.padded) - 256 * k);
    k = e;
  }
  // A param's chunks are all kept and in order, so its compact values are contiguous.
  for (auto& s : plan_.params) {
    const Shape& shape = shapes_.at(s.name);
    if (!reads_f32(s.name)) {
      if (bind_.set_param) bind_.set_param(s.name, Tensor::view_of(compute16_, s.offset, shape));
      continue;
    }
    const int64_t at = s.numel > 0 ? 256 * int64_t{slot[static_cast<size_t>(s.offset / 256)]} + s.offset % 256 : 0;
    if (bind_.set_param) bind_.set_param(s.name, Tensor::view_of(c, at, shape));
  }
  Tensor h = Tensor::empty({chunks}, DType::I32, MemCategory::Buffers, Device::cpu());
  std::copy(slot.begin(), slot.end(), h.i32());
  f32_slots_ = h.to(dev_, MemCategory::Params);
  compute_ = c;  // the full f32 copy goes
  compact_ = true;
}

void ShardedState::refresh_compute_params() {
  // No master (fp32, or bf16 master weights: the compute weights themselves) or compact: nothing to refresh
  // (compact: sync_compute16 rounds both copies from the master).
  if ((!mixed() && !o_.offload_optimizer) || compact_ || !master_.defined()) return;
  const DType dt = o_.compute_dtype;
  const int stage = o_.stage;
  if (o_.offload_optimizer) {  // host master -> (rounded) -> device compute pieces (through offload_stage_) or host
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      float* dst = stage < 3 ? compute_.f32() + own.begin : shard_piece(static_cast<int>(g));
      if (pdev_.is_cpu()) {  // offload_param: the shard lives in host memory (or on NVMe)
        kernels::cpu_backend().round_to(dt, master_.f32() + shard_off_[g], dst, own.size());
        if (stage == 3) put_piece(static_cast<int>(g), true);
        continue;
      }
      kernels::cpu_backend().round_to(dt, master_.f32() + shard_off_[g], offload_stage_.f32(), own.size());
      copy_timed(dst, offload_stage_.f32(), own.size());
    }
    return;
  }
  if (stage == 0) {
    kernels::backend(dev_).round_to(dt, master_.f32(), compute_.f32(), plan_.padded);
    return;
  }
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    Range own = plan_.owned(static_cast<int>(g), comm_.rank());
    float* dst = stage < 3 ? compute_.f32() + own.begin : shard_piece(static_cast<int>(g));
    kernels::backend(master_.device()).round_to(dt, master_.f32() + shard_off_[g], dst, own.size());
    if (stage == 3) put_piece(static_cast<int>(g), true);
  }
}

bool ShardedState::gathers16() const { return compact_ && (o_.stage == 1 || o_.stage == 2) && comm_.size() > 1; }

void ShardedState::sync_compute16() {
  kernels::Backend& be = kernels::backend(dev_);
  if (compact_) {  // from the master (the compact f32 copy does not cover every weight), both copies
    const DType dt = o_.compute_dtype;
    uint16_t* h = static_cast<uint16_t*>(compute16_.raw());
    if (o_.stage == 0) {
      be.round_to16(dt, master_.f32(), h, compute_.f32(), plan_.padded, f32_slots_.i32(), 0);
      return;
    }
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      be.round_to16(dt, master_.f32() + shard_off_[g], h + own.begin, compute_.f32(), own.size(), f32_slots_.i32(),
                    own.begin);
    }
    return;
  }
  if (compute16_.defined())
    be.round_to16(o_.compute_dtype, compute_.f32(), static_cast<uint16_t*>(compute16_.raw()), nullptr,
                  compute_.numel());
}

// The pieces gathered in 16 bits (half the bytes of f32) and the compact f32 copy widened from them.
void ShardedState::gather16() {
  const DType dt = o_.compute_dtype;
  uint16_t* h = static_cast<uint16_t*>(compute16_.raw());
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    const Group& grp = plan_.groups[g];
    Range own = plan_.owned(static_cast<int>(g), comm_.rank());
    Tensor mine = Tensor::empty({grp.shard}, dt, MemCategory::Buffers, dev_);
    mine.copy_from(Tensor::view_of(compute16_, own.begin, {grp.shard}));
    comm_.all_gather(mine.raw(), h + grp.offset, grp.shard, dt);
  }
  kernels::backend(dev_).widen16_slots(dt, h, compute_.f32(), plan_.padded, f32_slots_.i32());
}

void ShardedState::after_update(bool rounded) {
  if (!rounded) refresh_compute_params();
  if (gathers16()) {  // each rank's updated piece: written with the update, or rounded from the master here
    if (!rounded) sync_compute16();
    gather16();
    return;
  }
  const int W = comm_.size();
  const bool sharded12 = (o_.stage == 1 || o_.stage == 2) && W > 1;
  if (sharded12) {
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      const Group& grp = plan_.groups[g];
      Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      Tensor mine = Tensor::empty({grp.shard}, DType::F32, MemCategory::Buffers, dev_);
      copy_f32(mine.f32(), compute_.f32() + own.begin, grp.shard);
      comm_.all_gather(mine.f32(), compute_.f32() + grp.offset, grp.shard, DType::F32);
    }
  } else if (o_.stage == 3) {
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      if (!rt_[g].persistent) continue;
      const Group& grp = plan_.groups[g];
      Tensor staged;
      comm_.all_gather(gather_source(static_cast<int>(g), staged), rt_[g].full.f32(), grp.shard, DType::F32);
    }
  }
  // The 16-bit copy: written with the update where it covered everything, else rounded from compute_.
  if (!rounded || sharded12) sync_compute16();
}

UpdateTargets ShardedState::update_targets(int64_t begin) {
  // On-device fp32 master (16-bit, no offload, stages 0-2): the update writes the compute copies itself.
  if (!mixed() || o_.offload_optimizer || o_.stage == 3 || !master_.defined()) return {};
  UpdateTargets o;
  o.dt = o_.compute_dtype;
  o.f32 = compact_ ? compute_.f32() : compute_.f32() + begin;
  if (compute16_.defined()) o.h = static_cast<uint16_t*>(compute16_.raw()) + begin;
  if (compact_) o.f32_slots = f32_slots_.i32(), o.f32_base = begin;
  return o;
}

}  // namespace zerorun::zero
