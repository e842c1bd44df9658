// The executor's fusion plan, made once when it is built (DESIGN.md: the FusionPlan pass): which node outputs are
// stored in 16 bits and which neighbouring nodes one kernel computes. A separate pass so that every such decision
// is in one place and made only from what the ops declare (Op::emits16/takes16, Op::epilogue with
// Op::fuses_gelu, Op::residual_add with Op::fuses_residual), never from op names.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "zerorun/graph.h"

namespace zerorun {

// The graph as the executor indexes it: nodes in execution order, values numbered (graph inputs first).
struct GraphIndex {
  const std::vector<const Op*>& ops;                                // per node
  const std::vector<std::vector<size_t>>&node_in, &node_out;        // per node: value ids
  const std::vector<std::vector<std::pair<size_t, size_t>>>& uses;  // per value: (node, input)
  const std::vector<std::pair<int, size_t>>& producer;              // per value: (node, output); node -1: input
  const std::vector<size_t>& node_block;                            // per node
  size_t loss_id;                                                   // the loss value
};

struct FusionPlan {
  // Per node output: kept in 16 bits (where the backend has 16-bit activations): the producer emits16 it and every
  // consumer takes16 it; never the loss or an unread output.
  std::vector<std::vector<bool>> out16;
  // Epilogue fusions, per node: the epilogue node (Op::epilogue) a product computes in its forward (epilogue_fwd)
  // / whose derivative its input gradient applies (epilogue_bwd), or -1. Only Epilogue::GeluTanh exists.
  std::vector<int> epilogue_fwd, epilogue_bwd;
  // Residual fusions, per node: the residual_add node a product folds in (or -1) and that add's other input.
  std::vector<int> res_add;
  std::vector<size_t> res_value;
};

FusionPlan plan_fusions(const GraphIndex& g);

}  // namespace zerorun
