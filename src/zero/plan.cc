// ZeRO partition plan: padded groups and per-rank shard ranges.
#include <algorithm>
#include <set>

#include "zerorun/error.h"
#include "zerorun/zero_plan.h"

namespace zerorun::zero {

Range Plan::owned(int g, int rank) const {
  const Group& gr = groups.at(static_cast<size_t>(g));
  return {gr.offset + rank * gr.shard, gr.offset + (rank + 1) * gr.shard};
}

int64_t Plan::shard_numel() const {
  int64_t n = 0;
  for (auto& g : groups) n += g.shard;
  return n;
}

Range Plan::param_owned(int p, int rank) const {
  const ParamSlot& s = params.at(static_cast<size_t>(p));
  Range o = owned(s.group, rank);
  int64_t b = std::max(o.begin, s.offset), e = std::min(o.end, s.offset + s.numel);
  if (e <= b) return {0, 0};
  return {b - s.offset, e - s.offset};
}

Plan plan(const std::vector<ParamInput>& in, int world, int64_t align) {
  ZR_CHECK(world >= 1, "ZeRO plan: world size must be >= 1, got ", world);
  ZR_CHECK(align >= 1, "ZeRO plan: alignment must be >= 1, got ", align);
  Plan p;
  p.world = world;
  p.align = align;
  std::set<std::string> names;
  int next_group = 0;
  for (auto& x : in) {
    ZR_CHECK(x.numel >= 0, "ZeRO plan: parameter '", x.name, "' has negative size");
    ZR_CHECK(names.insert(x.name).second, "ZeRO plan: parameter '", x.name, "' listed twice");
    ZR_CHECK(x.group >= 0 && x.group <= next_group, "ZeRO plan: group ", x.group, " of '", x.name,
             "' out of order (groups must be 0, 1, 2, ... in first-appearance order)");
    if (x.group == next_group) {
      p.groups.emplace_back();
      ++next_group;
    }
  }
  // Lay groups out one after another; inside a group, params in input order.
  std::vector<std::vector<int>> members(p.groups.size());
  for (size_t i = 0; i < in.size(); ++i) members[static_cast<size_t>(in[i].group)].push_back(static_cast<int>(i));
  const int64_t unit = static_cast<int64_t>(world) * align;
  int64_t off = 0;
  p.params.resize(in.size());
  for (size_t g = 0; g < p.groups.size(); ++g) {
    Group& gr = p.groups[g];
    gr.offset = off;
    for (int i : members[g]) {
      ParamSlot& s = p.params[static_cast<size_t>(i)];
      s.name = in[static_cast<size_t>(i)].name;
      s.numel = in[static_cast<size_t>(i)].numel;
      s.group = static_cast<int>(g);
      s.offset = off + gr.numel;
      gr.numel += s.numel;
      gr.params.push_back(i);
    }
    gr.padded = (gr.numel + unit - 1) / unit * unit;
    if (gr.padded == 0) gr.padded = unit;  // every rank owns a non-empty, aligned piece
    gr.shard = gr.padded / world;
    off += gr.padded;
    p.total += gr.numel;
  }
  p.padded = off;
  return p;
}

StateEstimate estimate_model_states(double P, int stage, int world, bool mixed, bool gpu, bool offload_optimizer,
                                    bool offload_param, double f32_read, bool bf16_master, bool bf16_states) {
  ZR_CHECK(!bf16_master || (mixed && (!gpu || (offload_optimizer && stage >= 1))),
           "bf16 master weights: bf16 runs on CPU ranks, or on GPUs with offload_optimizer");
  ZR_CHECK(!bf16_states || bf16_master, "bf16 optimizer states need bf16 master weights");
  ZR_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3, got ", stage);
  ZR_CHECK(world >= 1, "world size must be >= 1, got ", world);
  const bool off = gpu && offload_optimizer && stage >= 1;
  const bool off_p = off && stage == 3 && offload_param;
  const double W = world;
  StateEstimate e;
  // Compute weights: f32 (full at stages 0-2, a shard at 3; only what is read in f32 where compact: 16-bit GPU runs
  // with the master on the device, whose stages 1-2 all-gather the 16-bit copy), plus the 16-bit copy the products
  // read.
  const bool compact = gpu && mixed && !off && stage < 3;
  const double compute = compact ? 4 * (f32_read < 0 ? P : f32_read) : stage < 3 ? 4 * P : 4 * P / W;
  const double compute16 = gpu && mixed && stage < 3 ? 2 * P : 0;
  const double grads = stage < 2 ? 4 * P : 4 * P / W;
  const double host_grad = off ? 4 * P / W : 0;
  const double master = (mixed && !bf16_master) || off ? (stage == 0 ? 4 * P : 4 * P / W) : 0;
  const double moments = (bf16_states ? 4 : 8) * (stage == 0 ? P : P / W);
  e.params = compute + compute16;
  e.grads = grads + host_grad;
  e.optimizer = master + moments;
  if (!gpu) {
    e.host = e.params + e.grads + e.optimizer;
    return e;
  }
  e.device = (off_p ? 0 : e.params) + grads + (off ? 0 : e.optimizer);
  e.host = (off_p ? compute : 0) + host_grad + (off ? e.optimizer : 0);
  return e;
}

}  // namespace zerorun::zero
