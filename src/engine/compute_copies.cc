// The engine's compute copies of its weights (stages 0-2: full; 16-bit runs: rounded copies of the fp32 master,
// one in 16 bits for the products and one in f32 for the ops that read f32 values, compact where it can be) and
// how an update or a load refreshes them.
#include <algorithm>
#include <vector>

#include "kernels/backend.h"
#include "zerorun/engine.h"

namespace zerorun {

void Engine::make_compact() {
  const int64_t chunks = (plan_.padded + 255) / 256;
  std::vector<int32_t> slot(static_cast<size_t>(chunks), -1);
  for (auto& s : plan_.params)
    if (s.numel > 0 && exec_->reads_f32(s.name))
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
    const Shape& shape = model_.shape(s.name);
    if (!exec_->reads_f32(s.name)) {
      exec_->set_param(s.name, Tensor::view_of(compute16_, s.offset, shape));
      continue;
    }
    const int64_t at = s.numel > 0 ? 256 * int64_t{slot[static_cast<size_t>(s.offset / 256)]} + s.offset % 256 : 0;
    exec_->set_param(s.name, Tensor::view_of(c, at, shape));
  }
  Tensor h = Tensor::empty({chunks}, DType::I32, MemCategory::Buffers, Device::cpu());
  std::copy(slot.begin(), slot.end(), h.i32());
  f32_slots_ = h.to(dev_, MemCategory::Params);
  compute_ = c;  // the full f32 copy goes
  compact_ = true;
}

void Engine::refresh_compute_params() {
  // No master (fp32, or bf16 master weights: the compute weights themselves) or compact: nothing to refresh.
  if ((!mixed_ && !offload_) || compact_ || !master_.defined()) return;  // compact: sync_compute16 rounds both copies from the master
  const DType dt = precision_dtype(cfg_.precision);
  if (offload_) {  // host master -> (rounded) -> device compute pieces (through offload_stage_) or host ones
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      zero::Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      float* dst = stage_ < 3 ? compute_.f32() + own.begin : param_shard_.f32() + shard_off_[g];
      if (pdev_.is_cpu()) {  // offload_param: the shard lives in host memory
        kernels::cpu_backend().round_to(dt, master_.f32() + shard_off_[g], dst, own.size());
        continue;
      }
      kernels::cpu_backend().round_to(dt, master_.f32() + shard_off_[g], offload_stage_.f32(), own.size());
      copy_f32(dst, offload_stage_.f32(), own.size());
    }
    return;
  }
  if (stage_ == 0) {
    be().round_to(dt, master_.f32(), compute_.f32(), plan_.padded);
    return;
  }
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    zero::Range own = plan_.owned(static_cast<int>(g), comm_.rank());
    float* dst = stage_ < 3 ? compute_.f32() + own.begin : param_shard_.f32() + shard_off_[g];
    kernels::backend(master_.device()).round_to(dt, master_.f32() + shard_off_[g], dst, own.size());
  }
}

void Engine::sync_compute16() {
  if (compact_) {  // from the master (the compact f32 copy does not cover every weight), both copies
    const DType dt = precision_dtype(cfg_.precision);
    uint16_t* h = static_cast<uint16_t*>(compute16_.raw());
    if (stage_ == 0) {
      be().round_to16(dt, master_.f32(), h, compute_.f32(), plan_.padded, f32_slots_.i32(), 0);
      return;
    }
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      zero::Range own = plan_.owned(static_cast<int>(g), comm_.rank());
      be().round_to16(dt, master_.f32() + shard_off_[g], h + own.begin, compute_.f32(), own.size(), f32_slots_.i32(),
                      own.begin);
    }
    return;
  }
  if (compute16_.defined())
    be().round_to16(precision_dtype(cfg_.precision), compute_.f32(), static_cast<uint16_t*>(compute16_.raw()), nullptr,
                    compute_.numel());
}

RoundedOut Engine::rounded_out(int64_t begin) {
  // On-device fp32 master (16-bit, no offload, stages 0-2): the update writes the compute copies itself.
  if (!mixed_ || offload_ || stage_ == 3 || !master_.defined()) return {};
  RoundedOut o;
  o.dt = precision_dtype(cfg_.precision);
  o.f32 = compact_ ? compute_.f32() : compute_.f32() + begin;
  if (compute16_.defined()) o.h = static_cast<uint16_t*>(compute16_.raw()) + begin;
  if (compact_) o.f32_slots = f32_slots_.i32(), o.f32_base = begin;
  return o;
}

}  // namespace zerorun
