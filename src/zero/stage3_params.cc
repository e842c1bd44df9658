// ShardedState's stage-3 parameter life cycle: a group is all-gathered before the first block that uses it (the
// next block's groups prefetched asynchronously within the prefetch and live budgets), bound while live, freed
// after the last block of a pass that needs it; groups below the persistence threshold stay gathered. The
// stage-2/3 gradient buckets ride on the same block hooks (src/zero/grad_buckets.cc).
#include <algorithm>

#include "zerorun/zero_state.h"

namespace zerorun::zero {

void ShardedState::start_gather(int g) {
  GroupRt& s = rt_[static_cast<size_t>(g)];
  if (s.full.defined()) return;  // live or in flight
  const Group& grp = plan_.groups[static_cast<size_t>(g)];
  s.full = Tensor::empty({grp.padded}, DType::F32, MemCategory::Params, dev_);
  const float* src = gather_source(g, s.staged);  // offload_param: the host shard (or the NVMe file's piece) first
  s.gather = comm_.all_gather_async(src, s.full.f32(), grp.shard, DType::F32);
}

void ShardedState::ensure_live(int g) {
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

void ShardedState::release(int g) {
  GroupRt& s = rt_[static_cast<size_t>(g)];
  if (s.persistent || !s.full.defined()) return;
  if (s.gather) s.gather->wait(), s.gather.reset();
  bind_params(g, false);
  s.full = Tensor();
}

void ShardedState::release_all() {
  if (o_.stage != 3) return;
  for (size_t g = 0; g < rt_.size(); ++g) {
    release(static_cast<int>(g));  // persistent groups stay
    if (!rt_[g].persistent) rt_[g].staged = Tensor();
  }
}

void ShardedState::bind_params(int g, bool live) {
  const Group& grp = plan_.groups[static_cast<size_t>(g)];
  if (!bind_.set_param) return;
  for (int p : grp.params) {
    const ParamSlot& s = plan_.params[static_cast<size_t>(p)];
    bind_.set_param(
        s.name,
        live ? Tensor::view_of(rt_[static_cast<size_t>(g)].full, s.offset - grp.offset, shapes_.at(s.name)) : Tensor());
  }
}

void ShardedState::on_block(size_t b, bool forward, bool before) {
  const size_t nb = block_groups_.size();
  if (o_.stage == 3) {
    if (before) {
      for (int g : block_groups_[b]) ensure_live(g);
      // Prefetch the next block in execution order within the budgets.
      size_t nxt = forward ? b + 1 : b - 1;
      if ((forward && b + 1 < nb) || (!forward && b > 0)) {
        int64_t budget = o_.prefetch_bucket, live = 0;
        for (auto& s : rt_)
          if (s.full.defined()) live += s.full.numel();
        for (int g : block_groups_[nxt]) {
          int64_t n = plan_.groups[static_cast<size_t>(g)].padded;
          if (rt_[static_cast<size_t>(g)].full.defined()) continue;
          if (n > budget || live + n > o_.max_live) break;
          if (piece_on_nvme(g)) {  // the piece read from the file while this block computes; gathered when needed
            param_nvme_->prefetch_range(shard_off_[static_cast<size_t>(g)] - nvme_base_,
                                        plan_.groups[static_cast<size_t>(g)].shard);
            budget -= n;
            continue;
          }
          start_gather(g);
          budget -= n;
          live += n;
        }
      }
    } else {
      // Free what the next block in execution order does not need (the last block's params stay for its
      // backward, which follows at once).
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
  if (o_.stage >= 2 && !forward && before) begin_grads(b);
  if (o_.stage >= 2 && !forward && !before) finish_grads(b);
}

}  // namespace zerorun::zero
