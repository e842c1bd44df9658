// The bucket layout of the flat parameter buffer (which parameters form each plan group, which groups each block
// uses), moved out of the Engine so that the estimate and the tests compute the same buckets without a graph.
#include <limits>
#include <map>
#include <set>

#include "zerorun/error.h"
#include "zerorun/zero_plan.h"

namespace zerorun::zero {

BucketLayout bucket_layout(const std::vector<ParamUse>& uses, int num_blocks, int64_t bucket) {
  ZR_CHECK(num_blocks >= 0 && bucket >= 1, "bucket layout: ", num_blocks, " blocks, bucket of ", bucket);
  BucketLayout L;
  std::map<std::string, int> group_of;
  int next = -1, cur_block = -1, last = 0;  // cur_block: the block whose first uses fill the current group
  int64_t cur_size = 0;
  for (const ParamUse& u : uses) {
    ZR_CHECK(u.block >= last && u.block < num_blocks, "bucket layout: parameter '", u.name, "' used in block ", u.block,
             " after block ", last, " (of ", num_blocks, ")");
    last = u.block;
    if (group_of.count(u.name)) continue;  // a later use (a tied weight) does not move the group on
    if (next < 0 || u.block != cur_block || (cur_size > 0 && cur_size + u.numel > bucket)) {
      ++next;
      cur_block = u.block;
      cur_size = 0;
    }
    cur_size += u.numel;
    group_of[u.name] = next;
    L.params.push_back({u.name, u.numel, next});
  }
  std::vector<std::set<int>> gs(static_cast<size_t>(num_blocks));
  for (const ParamUse& u : uses) gs[static_cast<size_t>(u.block)].insert(group_of.at(u.name));
  L.block_groups.resize(static_cast<size_t>(num_blocks));
  for (int b = 0; b < num_blocks; ++b) L.block_groups[b].assign(gs[b].begin(), gs[b].end());
  L.ready_block.assign(static_cast<size_t>(next + 1), -1);
  for (int b = num_blocks; b-- > 0;)
    for (int g : L.block_groups[static_cast<size_t>(b)]) L.ready_block[static_cast<size_t>(g)] = b;
  return L;
}

}  // namespace zerorun::zero
