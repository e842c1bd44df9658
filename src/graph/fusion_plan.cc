// The fusion plan (fusion_plan.h): one pass over the graph, driven only by the ops' declarations, run once when
// an Executor is built. Whether a planned fusion is used is decided at run time by the executor (the backend's
// fuses_gelu / fuses_residual, ZERORUN_FUSE, selective recomputation).
#include "fusion_plan.h"

namespace zerorun {
namespace {

// Output `out` of node i is stored in 16 bits.
bool store16(const GraphIndex& g, size_t i, size_t out) {
  const size_t v = g.node_out[i][out];
  if (v == g.loss_id || g.uses[v].empty() || !g.ops[i]->emits16(out)) return false;
  for (auto [node, k] : g.uses[v])
    if (!g.ops[node]->takes16(k)) return false;
  return true;
}

// An epilogue node (GELU) whose input comes only from a product that fuses it (computed in that product's
// epilogue) and, besides, whose output goes only to such a product (whose input gradient then applies the
// epilogue's derivative too), values 16-bit, all in one block.
void plan_epilogues(const GraphIndex& g, FusionPlan& p) {
  const size_t n = g.ops.size();
  p.epilogue_fwd.assign(n, -1);
  p.epilogue_bwd.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (g.ops[i]->epilogue() != Epilogue::GeluTanh || g.node_in[i].size() != 1 || g.node_out[i].size() != 1) continue;
    const size_t v = g.node_in[i][0], out = g.node_out[i][0];
    const auto [q, qo] = g.producer[v];
    if (q < 0 || qo != 0 || !g.ops[q]->fuses_gelu() || g.uses[v].size() != 1 || g.node_block[q] != g.node_block[i] ||
        !p.out16[q][0] || !p.out16[i][0])
      continue;
    p.epilogue_fwd[q] = static_cast<int>(i);
    if (g.uses[out].size() != 1) continue;
    const auto [c, k] = g.uses[out][0];
    if (k == 0 && g.ops[c]->fuses_gelu() && g.node_block[c] == g.node_block[i]) p.epilogue_bwd[c] = static_cast<int>(i);
  }
}

// A residual add with an input that comes only from a product that fuses it (f32, same block), the other input
// made before that product: the product adds it (cuBLASLt's C with beta 1) and the add is skipped.
void plan_residuals(const GraphIndex& g, FusionPlan& p) {
  const size_t n = g.ops.size();
  p.res_add.assign(n, -1);
  p.res_value.assign(n, 0);
  for (size_t a = 0; a < n; ++a) {
    if (!g.ops[a]->residual_add() || g.node_in[a].size() != 2 || g.node_in[a][0] == g.node_in[a][1]) continue;
    for (size_t k : {size_t{1}, size_t{0}}) {
      const size_t y = g.node_in[a][k], r = g.node_in[a][1 - k];
      const auto [q, qo] = g.producer[y];
      if (q < 0 || qo != 0 || !g.ops[q]->fuses_residual() || g.uses[y].size() != 1 || p.out16[q][0] ||
          g.node_block[q] != g.node_block[a] || p.res_add[q] >= 0 || g.producer[r].first >= q)
        continue;
      p.res_add[q] = static_cast<int>(a);
      p.res_value[q] = r;
      break;
    }
  }
}

}  // namespace

FusionPlan plan_fusions(const GraphIndex& g) {
  FusionPlan p;
  p.out16.resize(g.node_out.size());
  for (size_t i = 0; i < g.node_out.size(); ++i)
    for (size_t k = 0; k < g.node_out[i].size(); ++k) p.out16[i].push_back(store16(g, i, k));
  plan_epilogues(g, p);
  plan_residuals(g, p);
  return p;
}

}  // namespace zerorun
