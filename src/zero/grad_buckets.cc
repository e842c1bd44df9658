// ShardedState's stage-2/3 gradient buckets: before a block's backward each of its groups gets a zeroed full-size
// gradient bucket (bound as the parameters' gradients); after the backward of the last block that contributes to
// a group, the bucket is reduce-scattered and this rank's piece added to its gradient shard.
#include "kernels/backend.h"
#include "zerorun/profile.h"
#include "zerorun/zero_state.h"

namespace zerorun::zero {

void ShardedState::begin_grads(size_t b) {
  for (int g : block_groups_[b]) {
    GroupRt& s = rt_[static_cast<size_t>(g)];
    if (s.work_grad.defined()) continue;
    const Group& grp = plan_.groups[static_cast<size_t>(g)];
    s.work_grad = Tensor::zeros({grp.padded}, DType::F32, MemCategory::Grads, dev_);
    if (bind_.set_grad)
      for (int p : grp.params) {
        const ParamSlot& ps = plan_.params[static_cast<size_t>(p)];
        bind_.set_grad(ps.name, Tensor::view_of(s.work_grad, ps.offset - grp.offset, shapes_.at(ps.name)));
      }
  }
}

void ShardedState::finish_grads(size_t b) {
  for (int g : block_groups_[b]) {
    if (ready_block_[static_cast<size_t>(g)] != b) continue;
    GroupRt& s = rt_[static_cast<size_t>(g)];
    const Group& grp = plan_.groups[static_cast<size_t>(g)];
    profile::Scope ps("reduce_scatter grads");
    Tensor mine = Tensor::empty({grp.shard}, DType::F32, MemCategory::Grads, dev_);
    comm_.reduce_scatter(s.work_grad.f32(), mine.f32(), grp.shard, DType::F32);
    kernels::backend(dev_).accumulate(grads_shard_.f32() + shard_off_[static_cast<size_t>(g)], mine.f32(), grp.shard);
    if (bind_.set_grad)
      for (int p : grp.params) bind_.set_grad(plan_.params[static_cast<size_t>(p)].name, Tensor());
    s.work_grad = Tensor();
  }
}

}  // namespace zerorun::zero
