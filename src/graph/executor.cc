// Runs a validated graph: forward in node order, backward in reverse with
// gradient accumulation, block hooks, and activation checkpointing
// (a checkpointed block drops what it saved and recomputes in backward).
// It also fuses neighbouring nodes where the backend can (planned once by plan_fusions, fusion_plan.cc, from what
// the ops declare; ZERORUN_FUSE=0 turns it off): GELU into the linears on both sides, residual adds into the projection
// before them, an add's input gradients as its output gradient itself, and the loss op's backward into its forward when
// d(loss) is announced. The head and loss run over chunks of rows (chunked_loss), and selected nodes are recomputed
// (recompute_node).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "fusion_plan.h"
#include "kernels/backend.h"
#include "zerorun/graph.h"
#include "zerorun/knobs.h"
#include "zerorun/profile.h"

namespace zerorun {

Executor::Executor(const Graph& g, std::map<std::string, Tensor> params, std::map<std::string, Tensor> grads)
    : g_(g), params_(std::move(params)), grads_(std::move(grads)), params_f32_(g.params_read_f32()) {
  for (auto& in : g_.inputs) value_id_.emplace(in.name, value_id_.size());
  for (auto& n : g_.nodes) {
    ops_.push_back(&op_lookup(n.op));
    std::vector<size_t> ins, outs;
    for (auto& v : n.in) {
      auto it = value_id_.find(v);
      ZR_CHECK(it != value_id_.end(), "value '", v, "' used before it is produced");
      ins.push_back(it->second);
    }
    for (auto& v : n.out) outs.push_back(value_id_.emplace(v, value_id_.size()).first->second);
    node_in_.push_back(ins);
    node_out_.push_back(outs);
  }
  ZR_CHECK(value_id_.count(g_.loss), "graph loss '", g_.loss, "' is not a value");
  loss_id_ = value_id_[g_.loss];
  values_.resize(value_id_.size());
  value_grads_.resize(value_id_.size());
  saved_.resize(g_.nodes.size());
  block_ranges_ = g_.block_ranges();
  node_block_.resize(g_.nodes.size());
  for (size_t b = 0; b < block_ranges_.size(); ++b)
    for (size_t i = block_ranges_[b].first; i < block_ranges_[b].second; ++i) node_block_[i] = b;
  last_use_.assign(values_.size(), -1);
  uses_.resize(values_.size());
  producer_.assign(values_.size(), {-1, 0});
  for (size_t i = 0; i < node_in_.size(); ++i) {
    for (size_t k = 0; k < node_in_[i].size(); ++k) {
      last_use_[node_in_[i][k]] = static_cast<int>(i);
      uses_[node_in_[i][k]].push_back({i, k});
    }
    for (size_t k = 0; k < node_out_[i].size(); ++k) producer_[node_out_[i][k]] = {static_cast<int>(i), k};
  }
  checkpoint_block.assign(g_.blocks.size(), false);
  FusionPlan plan = plan_fusions({ops_, node_in_, node_out_, uses_, producer_, node_block_, loss_id_});
  out16_ = std::move(plan.out16);
  gelu_fwd_ = std::move(plan.epilogue_fwd);  // the one epilogue there is: GELU
  gelu_bwd_ = std::move(plan.epilogue_bwd);
  res_add_ = std::move(plan.res_add);
  res_value_ = std::move(plan.res_value);
  fuse_ = knobs().fuse;
  done_.assign(g_.nodes.size(), false);
  recompute_node.assign(g_.nodes.size(), false);
  plan_loss_chunks();
}

int Executor::set_recompute(const std::set<std::string>& classes, const std::vector<bool>& blocks) {
  int n = 0;
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    const size_t b = node_block_[i];
    if (b >= blocks.size() || !blocks[b] || !classes.count(ops_[i]->recompute_class())) continue;
    recompute_node[i] = true;
    ++n;
    for (auto& f : gelu_fwd_)  // recomputed by its own kernel: computed so in the forward too
      if (f == static_cast<int>(i)) f = -1;
  }
  return n;
}

// The loss, when it is rows_independent, and the chain of single-use row-local nodes back to the first with
// parameters (the head linear), all in one block and each taking only the previous one's output.
void Executor::plan_loss_chunks() {
  loss_chain_.clear();
  const int l = producer_[loss_id_].first;
  if (l < 0 || !ops_[l]->is_loss() || !ops_[l]->rows_independent() || node_in_[l].size() != 2) return;
  std::vector<size_t> chain{static_cast<size_t>(l)};
  for (;;) {
    const size_t v = node_in_[chain.front()][0];
    const auto [p, po] = producer_[v];
    if (p < 0 || po != 0 || uses_[v].size() != 1 || !ops_[p]->rows_independent() || ops_[p]->is_loss() ||
        node_block_[p] != node_block_[l] || node_in_[p].size() != 1 || node_out_[p].size() != 1 || gelu_fwd_[p] >= 0 ||
        res_add_[p] >= 0)
      return;
    chain.insert(chain.begin(), static_cast<size_t>(p));
    if (!g_.nodes[p].params.empty()) break;
  }
  loss_chain_ = chain;
}

int64_t Executor::chunk_rows(int64_t N) const {
  if (loss_chain_.empty()) return 0;
  const size_t h = loss_chain_.front();
  const Tensor& x = values_[node_in_[h][0]];
  const auto wit = g_.nodes[h].params.find("weight");
  if (!x.defined() || x.dim(-1) == 0 || wit == g_.nodes[h].params.end()) return 0;
  const auto pit = params_.find(wit->second);
  if (pit == params_.end() || !pit->second.defined() || pit->second.shape().size() != 2) return 0;
  const int64_t V = pit->second.dim(0);
  bool all16 = kernels::backend(x.device()).activations16();  // the chain's values all in 16 bits
  for (size_t k = 0; k + 1 < loss_chain_.size(); ++k) all16 = all16 && out16_[loss_chain_[k]][0];
  int64_t r = loss_chunk_rows;
  if (r <= 0 && loss_chunk_bytes > 0 && V >= loss_chunk_min_vocab)
    r = std::max<int64_t>(8, loss_chunk_bytes / (V * (all16 ? 2 : 4)) / 8 * 8);
  return r > 0 && r < N ? r : 0;
}

void Executor::fill_params(size_t i, NodeCtx& c, bool with16) const {
  for (auto& [role, name] : g_.nodes[i].params) {
    auto it = params_.find(name);
    ZR_CHECK(it != params_.end() && it->second.defined(), "parameter '", name, "' is not materialised");
    c.params[role] = it->second;
    if (!with16) continue;
    auto h = params16_.find(name);
    if (h != params16_.end() && h->second.defined()) c.params16[role] = h->second;
  }
}

void Executor::fill_param_grads(size_t i, NodeCtx& c) {
  const Node& n = g_.nodes[i];
  for (auto& role_name : n.params) {
    const std::string &role = role_name.first, &name = role_name.second;  // (lambdas cannot capture bindings)
    auto it = grads_.find(name);
    if (it == grads_.end() || !it->second.defined()) continue;
    c.dparams[role] = it->second;
    if (fresh_.erase(name) == 0) continue;
    // The first write of this gradient: the op overwrites it where it can (and the node has the tensor in
    // this one role), else it is zeroed here and accumulated into.
    const bool once =
        std::count_if(n.params.begin(), n.params.end(), [&](const auto& rp) { return rp.second == name; }) == 1;
    if (once && ops_[i]->writes_param_grad(role))
      c.dparams_fresh.insert(role);
    else
      it->second.zero_();
  }
}

// The loss chain over chunks of R rows of the head's input x [N, C] (targets: the same rows). Forward: each
// chunk's loss (divided by N: the chunks' losses add up to the mean) into the loss value. Backward: each chunk's
// forward again (the loss op told d(loss) where it fuses its backward into its forward), then the chain's
// backward on the chunk: d(x) rows written into x's gradient, the head's parameter gradients accumulated.
void Executor::chunked_loss(bool backward) {
  const size_t h = loss_chain_.front(), l = loss_chain_.back(), nc = loss_chain_.size();
  const Tensor x = values_[node_in_[h][0]], tg = values_[node_in_[l][1]];
  const int64_t C = x.dim(-1), N = x.numel() / C, R = chunk_rows(N);
  ZR_CHECK(R > 0 && tg.numel() == N, "chunked loss: ", tg.numel(), " targets for ", N, " rows");
  const Device dev = x.device();
  kernels::Backend& be = kernels::backend(dev);
  Tensor loss, dx;
  bool dx_acc = true;
  const Tensor dloss = backward ? value_grads_[loss_id_] : Tensor();
  const size_t xv = node_in_[h][0];
  int64_t chunks = 0;
  for (int64_t r0 = 0; r0 < N; r0 += R, ++chunks) {
    const int64_t n = std::min(R, N - r0);
    std::vector<Tensor> vals{Tensor::view_of(x, r0 * C, {n, C})};  // vals[k]: chain node k's input 0
    const Tensor tgc = Tensor::view_of(tg, r0, {n});
    std::vector<std::vector<Tensor>> saved(nc);
    Tensor closs;
    for (size_t k = 0; k < nc; ++k) {
      const size_t i = loss_chain_[k];
      NodeCtx c;
      c.node = &g_.nodes[i];
      c.in = {vals.back()};
      if (i == l) {
        c.in.push_back(tgc);
        c.loss_denom = N;
        if (backward && fuse_) c.loss_grad = dloss;
      }
      c.out16 = out16_[i];
      c.saved = &saved[k];
      c.dropout = &dropout_;
      fill_params(i, c, true);
      {
        profile::Scope ps("fwd", g_.nodes[i].op);
        ops_[i]->forward(c);
      }
      ZR_CHECK(c.out.size() == 1, "op ", g_.nodes[i].op, " produced the wrong number of outputs");
      if (i == l)
        closs = c.out[0];
      else
        vals.push_back(c.out[0]);
    }
    if (!backward) {
      if (!loss.defined())
        loss = closs;
      else
        be.add_fwd(loss.f32(), closs.f32(), loss.f32(), 1, 1);
      continue;
    }
    Tensor dout = dloss;
    for (size_t k = nc; k-- > 0;) {
      const size_t i = loss_chain_[k];
      NodeCtx c;
      c.node = &g_.nodes[i];
      c.dropout = &dropout_;
      c.in = {vals[k]};
      if (i == l) c.in.push_back(tgc);
      c.out = {i == l ? closs : vals[k + 1]};
      c.dout = {dout};
      c.loss_denom = i == l ? N : 0;
      fill_params(i, c, false);
      if (k == 0) {  // the head: d(x) rows of x's gradient, made at the first chunk
        Tensor& gv = value_grads_[xv];
        if (r0 == 0 && !gv.defined()) {
          dx_acc = !ops_[h]->writes_grad(0);
          const auto [pn, po] = producer_[xv];
          const bool g16 = !dx_acc && be.activations16() && uses_[xv].size() == 1 && pn >= 0 &&
                           ops_[pn]->takes_dout16(po) && ops_[h]->writes_grad16(c, 0);
          const DType gdt = g16 ? be.matmul_dtype() : DType::F32;
          gv = dx_acc ? Tensor::zeros(x.shape(), DType::F32, MemCategory::Activations, dev)
                      : Tensor::uninit(x.shape(), gdt, MemCategory::Activations, dev);
        } else if (r0 == 0) {
          dx_acc = true;
        }
        c.din = {Tensor::view_of(gv, r0 * C, {n, C})};
        c.din_acc = {dx_acc};
        fill_param_grads(i, c);
      } else {
        const size_t p = loss_chain_[k - 1];
        const bool w = ops_[i]->writes_grad(0);
        const bool g16 = w && be.activations16() && ops_[p]->takes_dout16(0) && ops_[i]->writes_grad16(c, 0);
        const Shape& s = vals[k].shape();
        c.din = {w ? Tensor::uninit(s, g16 ? be.matmul_dtype() : DType::F32, MemCategory::Activations, dev)
                   : Tensor::zeros(s, DType::F32, MemCategory::Activations, dev)};
        c.din_acc = {!w};
        if (i == l) {  // no gradient for the targets
          c.din.emplace_back();
          c.din_acc.push_back(true);
        }
      }
      c.saved = &saved[k];
      {
        profile::Scope ps("bwd", g_.nodes[i].op);
        ops_[i]->backward(c);
      }
      dout = c.din[0];  // the op may have handed over another tensor (the fused loss: its logits)
      saved[k].clear();
      if (k > 0) vals[k] = Tensor();
    }
  }
  loss_chunks_ = chunks;
  if (!backward) values_[loss_id_] = loss;
}

bool Executor::reads_f32(const std::string& name) const {
  return !params16_.count(name) || params_f32_.count(name) > 0;
}

// Nodes that drop out carry their probability as the attribute "dropout" (the dropout op, attention's probabilities).
bool Executor::has_dropout() const {
  return std::any_of(g_.nodes.begin(), g_.nodes.end(), [](const Node& n) {
    auto it = n.attrs.find("dropout");
    return it != n.attrs.end() && it->is_number() && it->get<double>() > 0.0;
  });
}

namespace {
int planned(const std::vector<int>& per_node) {  // entries naming a fused partner node
  return static_cast<int>(std::count_if(per_node.begin(), per_node.end(), [](int i) { return i >= 0; }));
}
}  // namespace

int Executor::residual_fusions() const { return planned(res_add_); }

// Inputs whose gradient can be the output's gradient tensor itself (Op::grad_is_dout): fresh, f32, the output's
// shape, not the node's input twice, the tensor no other live value's gradient. Two inputs share it only when every
// read of one's gradient comes before any accumulation into the other's: one has this node as its only use and its
// producer runs backward before every other consumer of the first.
std::vector<bool> Executor::grad_aliases(size_t i, const std::vector<Tensor>& dout) const {
  std::vector<bool> a(node_in_[i].size(), false);
  if (!fuse_ || dout.size() != 1 || !dout[0].defined() || dout[0].dtype() != DType::F32) return a;
  for (size_t u = 0; u < value_grads_.size(); ++u)  // the tensor is some other live value's gradient too: keep apart
    if (u != node_out_[i][0] && value_grads_[u].defined() && value_grads_[u].raw() == dout[0].raw()) return a;
  auto last_other_use = [&](size_t v) {  // the latest consumer of v before node i, or -1
    int j = -1;
    for (auto [node, k] : uses_[v])
      if (node < i) j = std::max(j, static_cast<int>(node));
    return j;
  };
  auto ordered = [&](size_t only, size_t other) {  // `only`'s gradient is read before `other`'s next change
    return uses_[only].size() == 1 && producer_[only].first > last_other_use(other);
  };
  std::vector<size_t> shared;
  for (size_t k = 0; k < node_in_[i].size(); ++k) {
    const size_t v = node_in_[i][k];
    if (!ops_[i]->grad_is_dout(k) || value_grads_[v].defined() || values_[v].dtype() != DType::F32 ||
        values_[v].shape() != dout[0].shape() || std::count(node_in_[i].begin(), node_in_[i].end(), v) > 1)
      continue;
    bool ok = true;
    for (size_t u : shared) ok = ok && (ordered(v, u) || ordered(u, v));
    if (!ok) continue;
    a[k] = true;
    shared.push_back(v);
  }
  return a;
}

int Executor::gelu_forward_fusions() const { return planned(gelu_fwd_); }
int Executor::gelu_backward_fusions() const { return planned(gelu_bwd_); }

bool Executor::stores16(const std::string& value) const {
  auto it = value_id_.find(value);
  ZR_CHECK(it != value_id_.end() && producer_[it->second].first >= 0, "'", value, "' is not a node output");
  const auto [node, out] = producer_[it->second];
  return out16_[static_cast<size_t>(node)][out];
}

void Executor::run_node_forward(size_t i) {
  const Node& n = g_.nodes[i];
  if (done_[i]) {  // its producer's epilogue wrote the output
    done_[i] = false;
    saved_[i].clear();
    return;
  }
  if (!loss_chain_.empty() && i == loss_chain_.front()) {
    const Tensor& x = values_[node_in_[i][0]];
    if (x.defined() && x.numel() > 0 && chunk_rows(x.numel() / x.dim(-1)) > 0) {
      chunked_loss(false);
      for (size_t k : loss_chain_) saved_[k].clear();
      for (size_t k = 1; k < loss_chain_.size(); ++k) done_[loss_chain_[k]] = true;
      return;
    }
  }
  NodeCtx c;
  c.node = &n;
  for (auto v : node_in_[i]) c.in.push_back(values_[v]);
  c.out16 = out16_[i];
  const Device dev = c.in.at(0).device();
  kernels::Backend& be = kernels::backend(dev);
  const int gl = gelu_fwd_[i];
  c.fuse_gelu = fuse_ && gl >= 0 && be.fuses_gelu();
  if (fuse_ && res_add_[i] >= 0 && be.fuses_residual() && values_[res_value_[i]].defined() &&
      values_[res_value_[i]].dtype() == DType::F32)
    c.residual = values_[res_value_[i]];
  if (have_loss_grad_ && fuse_ && ops_[i]->is_loss() && node_out_[i].size() == 1 && node_out_[i][0] == loss_id_ &&
      !node_in_[i].empty() && uses_[node_in_[i][0]].size() == 1) {
    if (!loss_grad_t_.defined()) {
      loss_grad_t_ = Tensor::empty({}, DType::F32, MemCategory::Activations, dev);
      be.set_scalar(loss_grad_t_.f32(), loss_grad_);
    }
    c.loss_grad = loss_grad_t_;
  }
  fill_params(i, c, true);
  saved_[i].clear();
  c.saved = &saved_[i];
  c.dropout = &dropout_;
  {
    profile::Scope ps("fwd", n.op);
    ops_[i]->forward(c);
  }
  if (c.fuse_gelu) {
    ZR_CHECK(c.out.size() == 2, "op ", n.op, " did not produce the fused GELU output");
    values_[node_out_[static_cast<size_t>(gl)][0]] = c.out[1];
    c.out.pop_back();
    done_[static_cast<size_t>(gl)] = true;
  }
  ZR_CHECK(c.out.size() == node_out_[i].size(), "op ", n.op, " produced the wrong number of outputs");
  if (c.residual_used) {  // the add's output too: the add is skipped
    const size_t a = static_cast<size_t>(res_add_[i]);
    values_[node_out_[a][0]] = c.out[0];
    done_[a] = true;
  }
  for (size_t k = 0; k < c.out.size(); ++k) values_[node_out_[i][k]] = c.out[k];
}

double Executor::forward(const std::map<std::string, Tensor>& inputs) {
  const Tensor l = forward_async(inputs);
  return static_cast<double>(kernels::backend(l.device()).get_scalar(l.f32()));
}

Tensor Executor::forward_async(const std::map<std::string, Tensor>& inputs) {
  std::fill(done_.begin(), done_.end(), false);
  loss_chunks_ = 0;
  have_loss_grad_ = have_next_loss_grad_;
  loss_grad_ = next_loss_grad_;
  have_next_loss_grad_ = false;
  loss_grad_t_ = Tensor();
  for (auto& in : g_.inputs) {
    auto it = inputs.find(in.name);
    if (it == inputs.end() && in.optional) {  // left out: the ops reading it see an undefined tensor
      values_[value_id_[in.name]] = Tensor();
      continue;
    }
    ZR_CHECK(it != inputs.end(), "forward: graph input '", in.name, "' was not given");
    ZR_CHECK(it->second.dtype() == in.dtype, "forward: input '", in.name, "' must be ", dtype_name(in.dtype));
    values_[value_id_[in.name]] = it->second;
  }
  for (size_t b = 0; b < block_ranges_.size(); ++b) {
    if (hooks.before_block_forward) hooks.before_block_forward(b);
    auto [lo, hi] = block_ranges_[b];
    for (size_t i = lo; i < hi; ++i) run_node_forward(i);
    if (checkpoint_block[b]) {
      // Keep only values that leave the block; drop everything saved inside it.
      for (size_t i = lo; i < hi; ++i) {
        saved_[i].clear();
        for (auto v : node_out_[i])
          if (v != loss_id_ && last_use_[v] >= 0 && static_cast<size_t>(last_use_[v]) < hi) values_[v] = Tensor();
      }
    } else {
      // Selective recomputation: the marked nodes' outputs read only inside the block, and what they saved.
      for (size_t i = lo; i < hi; ++i) {
        if (!recompute_node[i]) continue;
        saved_[i].clear();
        for (auto v : node_out_[i])
          if (v != loss_id_ && last_use_[v] >= 0 && static_cast<size_t>(last_use_[v]) < hi) values_[v] = Tensor();
      }
    }
    if (hooks.after_block_forward) hooks.after_block_forward(b);
  }
  have_forward_ = true;
  return values_[loss_id_];
}

void Executor::backward(float loss_grad) {
  ZR_CHECK(have_forward_, "backward called without a forward");
  aliased_ = 0;
  for (auto& t : value_grads_) t = Tensor();
  const Device dev = values_[loss_id_].device();
  ZR_CHECK(!have_loss_grad_ || loss_grad == loss_grad_, "backward: d(loss) ", loss_grad,
           " differs from the value announced before the forward, ", loss_grad_);
  if (loss_grad_t_.defined()) {  // made in the forward (a loss op may have used it already)
    value_grads_[loss_id_] = loss_grad_t_;
  } else {
    Tensor lg = Tensor::empty({}, DType::F32, MemCategory::Activations, dev);
    kernels::backend(dev).set_scalar(lg.f32(), loss_grad);
    value_grads_[loss_id_] = lg;
  }
  for (size_t bi = block_ranges_.size(); bi-- > 0;) {
    if (hooks.before_block_backward) hooks.before_block_backward(bi);
    auto [lo, hi] = block_ranges_[bi];
    for (size_t i = lo; i < hi; ++i)
      if (checkpoint_block[bi] || recompute_node[i]) run_node_forward(i);
    for (size_t i = hi; i-- > lo;) {
      const Node& n = g_.nodes[i];
      if (loss_chunks_ > 0 && i == loss_chain_.back() && value_grads_[loss_id_].defined()) {
        chunked_loss(true);
        value_grads_[loss_id_] = Tensor();
        for (size_t k : loss_chain_) saved_[k].clear();
        continue;
      }
      NodeCtx c;
      c.node = &n;
      c.dropout = &dropout_;
      bool any = false;
      for (auto v : node_out_[i]) {
        c.out.push_back(values_[v]);
        c.dout.push_back(value_grads_[v]);
        any = any || value_grads_[v].defined();
      }
      if (!any) continue;  // nothing downstream needs this node
      for (size_t k = 0; k < node_out_[i].size(); ++k)
        if (!c.dout[k].defined())
          c.dout[k] = Tensor::zeros(c.out[k].shape(), DType::F32, MemCategory::Activations, c.out[k].device());
      for (auto v : node_in_[i]) c.in.push_back(values_[v]);
      const bool be16 = kernels::backend(dev).activations16();
      // GELU's backward done by this linear's input gradient: its input's gradient is written here, so the
      // GELU node (whose output gradient is then never made) is skipped.
      const int gl = gelu_bwd_[i];
      size_t gelu_in = 0;
      bool dgelu = false;
      if (fuse_ && gl >= 0 && kernels::backend(dev).fuses_gelu()) {
        gelu_in = node_in_[static_cast<size_t>(gl)][0];
        dgelu = is16(values_[gelu_in]) && is16(values_[node_in_[i][0]]) && !value_grads_[gelu_in].defined() &&
                !value_grads_[node_in_[i][0]].defined();
      }
      const std::vector<bool> alias = grad_aliases(i, c.dout);
      std::vector<size_t> din_value;
      for (size_t k = 0; k < node_in_[i].size(); ++k) {
        const size_t v = dgelu && k == 0 ? gelu_in : node_in_[i][k];
        din_value.push_back(v);
        Tensor& gv = value_grads_[v];
        if (alias[k]) {  // the output's gradient is this input's: shared, nothing for the op to write
          gv = c.dout[0];
          ++aliased_;
          c.din.emplace_back();
          c.din_acc.push_back(true);
          continue;
        }
        bool acc = true;
        if (!values_[v].defined()) {  // an optional graph input left out: no gradient
          c.din.emplace_back();
          c.din_acc.push_back(true);
          continue;
        }
        if (!gv.defined() && values_[v].dtype() != DType::I32) {
          // The first gradient written into a value needs no zero-fill when the op overwrites it, unless
          // the value is this node's input twice (both writes would then have to be ordered).
          const bool twice = std::count(node_in_[i].begin(), node_in_[i].end(), node_in_[i][k]) > 1;
          acc = twice || !ops_[i]->writes_grad(k);
          // A value with this one use gets a 16-bit gradient where this op can write and its producer read one.
          const auto [pn, po] = producer_[v];
          const bool g16 = !acc && be16 && uses_[v].size() == 1 && pn >= 0 && ops_[pn]->takes_dout16(po) &&
                           ops_[i]->writes_grad16(c, k);
          const DType gdt = g16 ? kernels::backend(dev).matmul_dtype() : DType::F32;
          gv = acc ? Tensor::zeros(values_[v].shape(), DType::F32, MemCategory::Activations, values_[v].device())
                   : Tensor::uninit(values_[v].shape(), gdt, MemCategory::Activations, values_[v].device());
        }
        c.din.push_back(gv);
        c.din_acc.push_back(acc);
      }
      if (dgelu) {
        ZR_CHECK(!c.din_acc[0] && is16(c.din[0]), "fused GELU gradient: expected a fresh 16-bit gradient");
        c.dgelu_input = values_[gelu_in];
      }
      for (auto& [role, name] : n.params) c.params[role] = params_[name];
      fill_param_grads(i, c);
      c.saved = &saved_[i];
      {
        profile::Scope ps("bwd", n.op);
        ops_[i]->backward(c);
      }
      for (size_t k = 0; k < c.din.size(); ++k)  // a fresh gradient the op handed over as another tensor
        if (!c.din_acc[k] && c.din[k].defined() && value_grads_[din_value[k]].raw() != c.din[k].raw())
          value_grads_[din_value[k]] = c.din[k];
      // Outputs' gradients are fully consumed now.
      for (auto v : node_out_[i]) value_grads_[v] = Tensor();
      saved_[i].clear();
    }
    // The block's values are read by no backward still to run (consumers come later in forward order): freed, so
    // what a recomputed block or node made again does not stay for the rest of the backward.
    for (size_t i = lo; i < hi; ++i)
      for (auto v : node_out_[i])
        if (v != loss_id_) values_[v] = Tensor();
    if (hooks.after_block_backward) hooks.after_block_backward(bi);
  }
  for (const auto& name : fresh_) grads_.at(name).zero_();  // still fresh: no gradient path, zeros
  fresh_.clear();
  release();
}

void Executor::mark_grads_fresh() {
  for (const auto& [name, t] : grads_)
    if (t.defined()) fresh_.insert(name);
}

void Executor::release() {
  have_loss_grad_ = false;
  loss_grad_t_ = Tensor();
  for (auto& t : values_) t = Tensor();
  for (auto& t : value_grads_) t = Tensor();
  for (auto& s : saved_) s.clear();
  have_forward_ = false;
}

}  // namespace zerorun
