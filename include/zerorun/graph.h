// Autograd-lite: a static graph of nodes in execution order, grouped into
// blocks. Forward runs nodes in order; backward runs them in reverse,
// accumulating parameter gradients, and fires hooks at block boundaries
// (ZeRO uses them; the graph itself knows nothing about ZeRO).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "zerorun/tensor.h"

namespace zerorun {

using json = nlohmann::json;

struct InputSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::string> dims;  // each a number or a symbol ("B", "T")
  // An input the caller may leave out (JSON "optional": true): its value is then undefined and the ops reading it
  // fall back to their behaviour without it ("positions": per-document positions of packed sequences).
  bool optional = false;
};

struct Node {
  std::string op;
  std::string block;
  std::vector<std::string> in, out;
  std::map<std::string, std::string> params;  // role -> tensor name
  json attrs = json::object();
};

struct ValueInfo {
  Shape shape;
  DType dtype = DType::F32;
};

// Where the random masks of dropout nodes come from (kernels/counter_rng.h): off (eval, or a graph run outside
// training) makes dropout the identity; on, a node's mask is a function of the seed, the optimizer step (1-based),
// its "site" attribute and the global index of the micro-batch's first sample (sample0), so every rank count and
// micro-batch split draws the same mask for the same sample.
struct DropoutCtx {
  bool on = false;
  uint64_t seed = 0, step = 0;
  int64_t sample0 = 0;
};

// What an op sees when it runs. Inputs/params are read-only; backward
// accumulates (+=) into defined din / dparams entries, except that a din[k]
// with din_acc[k] false is fresh memory the op overwrites (see Op::writes_grad).
struct NodeCtx {
  const Node* node = nullptr;
  std::vector<Tensor> in, out;
  std::map<std::string, Tensor> params;
  // Copies of params rounded to the backend's matmul dtype, kept current by the engine (16-bit CUDA runs, where
  // it keeps them): ops use these instead of rounding a param on every call. Absent roles: no such copy.
  std::map<std::string, Tensor> params16;
  std::vector<Tensor>* saved = nullptr;  // what forward keeps for backward
  const DropoutCtx* dropout = nullptr;   // the executor's (Executor::set_dropout); null: off
  std::vector<Tensor> din, dout;
  std::vector<bool> din_acc;  // per input; missing entries mean "accumulate"
  std::vector<bool> out16;    // forward: outputs the executor asks for in 16-bit storage (see Op::emits16)
  // GELU fused into a linear by the executor (Op::fuses_gelu, where the backend has it): forward: also emit
  // gelu(output) as out[1]; backward: the input is gelu(dgelu_input), and din[0] is that value's gradient.
  bool fuse_gelu = false;
  Tensor dgelu_input;
  // Forward of the loss op where the executor knows the backward's d(loss) already (Executor::set_next_loss_grad):
  // that scalar, on the device. Input 0 is then read by this op alone, and it may overwrite it with its gradient
  // (its backward may hand that tensor over as din[0] instead of writing the fresh one).
  Tensor loss_grad;
  // The loss op (Op::rows_independent) runs on one chunk of the batch's rows: its mean divides by this many rows
  // (the batch's) instead of its own, so the chunks' losses and gradients add up to the batch's. 0: its own rows.
  int64_t loss_denom = 0;
  // A residual add folded into this linear by the executor (Op::fuses_residual): forward: out[0] = linear + residual
  // where the shapes match (setting residual_used); the linear's own output is then not materialised.
  Tensor residual;
  bool residual_used = false;
  std::map<std::string, Tensor> dparams;
  // Roles whose dparams entry is the step's first write (Op::writes_param_grad): the op overwrites it.
  std::set<std::string> dparams_fresh;
  const Tensor& param(const std::string& role) const;
  Tensor dparam(const std::string& role) const;  // undefined if no grad wanted
};

// Elementwise epilogues a product may apply to its own output in place of the node that follows it (the fusion
// plan, src/graph/fusion_plan.cc, pairs an op declaring one with a producer that fuses it).
enum class Epilogue {
  None,
  GeluTanh,  // GELU, tanh approximation (consumer side: Op::fuses_gelu, NodeCtx::fuse_gelu)
};

class Op {
 public:
  virtual ~Op() = default;
  // Roles this op takes; `optional` roles may be absent.
  virtual std::vector<std::string> required_params() const { return {}; }
  virtual std::vector<std::string> optional_params() const { return {}; }
  // Validates inputs, params and attrs; returns the output shapes/dtypes.
  virtual std::vector<ValueInfo> infer(const Node& n, const std::vector<ValueInfo>& in,
                                       const std::map<std::string, Shape>& params) const = 0;
  virtual void forward(NodeCtx& c) const = 0;
  virtual void backward(NodeCtx& c) const = 0;
  // True where backward, whenever din[input] is defined, writes all of it (so the
  // executor hands it a fresh, unzeroed gradient with din_acc false the first time).
  virtual bool writes_grad(size_t /*input*/) const { return false; }
  // True where backward honours NodeCtx::dparams_fresh for parameter `role` (writes all of that gradient).
  virtual bool writes_param_grad(const std::string& /*role*/) const { return false; }
  // 16-bit activation storage (backends with activations16(), i.e. CUDA in bf16/fp16 runs). A value is
  // stored in 16 bits when its producer emits16 and every consumer takes16 it; its gradient is when it has
  // one consumer, which writes_grad16 it (fresh, in the matmul dtype), and the producer takes_dout16.
  virtual bool emits16(size_t /*output*/) const { return false; }
  virtual bool takes16(size_t /*input*/) const { return false; }
  virtual bool writes_grad16(const NodeCtx& /*c*/, size_t /*input*/) const { return false; }
  virtual bool takes_dout16(size_t /*output*/) const { return false; }
  // True for ops whose output is the scalar loss.
  virtual bool is_loss() const { return false; }
  // Whether the op honours NodeCtx::fuse_gelu and dgelu_input (linear): it may absorb an Epilogue::GeluTanh node.
  virtual bool fuses_gelu() const { return false; }
  // The elementwise epilogue this one-input, one-output op is (gelu: GeluTanh): a preceding product that fuses it
  // may compute it in its forward, and a following one apply its derivative in its input gradient.
  virtual Epilogue epilogue() const { return Epilogue::None; }
  // Reads parameter `role` only through its 16-bit copy where the executor holds one (NodeCtx::params16), never
  // its f32 values: the engine then need not refresh the f32 compute copy of it after an update.
  virtual bool reads_param16_only(const std::string& /*role*/) const { return false; }
  // True where d(input) is d(output) itself whenever their shapes match (add): the executor may then hand the
  // input the output's gradient tensor and leave din[input] undefined.
  virtual bool grad_is_dout(size_t /*input*/) const { return false; }
  // Whether the op honours NodeCtx::residual (linear): it may absorb a residual_add node reading its output.
  virtual bool fuses_residual() const { return false; }
  // A plain two-input add, out[0] = in[0] + in[1] and nothing else (add): a preceding product that fuses_residual
  // may compute it as its epilogue (where the shapes match at run time) and the node is then skipped.
  virtual bool residual_add() const { return false; }
  // Row-local: input 0 and output 0 are [..., width] and each output row depends only on the same input row
  // (other inputs, if any, indexed by the same rows: a loss's targets); for a loss, it honours
  // NodeCtx::loss_denom. The executor may then run the op on chunks of rows (linear, softcap, cross_entropy: the
  // chunked head and loss).
  virtual bool rows_independent() const { return false; }
  // Bytes a node of this op saves for its backward besides its outputs, given its inputs (validated), on the CPU or
  // a GPU (attention: the CPU kernel's probabilities, the GPU kernels' row statistics): the memory estimate's
  // activations (src/engine/estimate.cc).
  virtual double saved_bytes(const Node& /*n*/, const std::vector<ValueInfo>& /*in*/, bool /*gpu*/) const { return 0; }
  // What selective recomputation calls this op (Executor::recompute): "norms", "mlp_act", "attention"; empty:
  // never recomputed alone.
  virtual const char* recompute_class() const { return ""; }
};

const Op& op_lookup(const std::string& name);  // throws with the list of known ops
std::vector<std::string> op_names();

class Graph {
 public:
  std::vector<InputSpec> inputs;
  std::vector<std::string> blocks;
  std::vector<Node> nodes;
  std::string loss;
  json meta = json::object();  // "arch", "arch_config" (for merge's config.json)

  static Graph from_json(const json& j);  // structural checks only
  json to_json() const;
  // Full validation against parameter shapes with symbols bound to
  // `symbols` (e.g. B=2, T=8): ops, roles, shapes, block order, loss.
  std::map<std::string, ValueInfo> validate(const std::map<std::string, Shape>& param_shapes,
                                            const std::map<std::string, int64_t>& symbols) const;
  // Parameter names in first-use order (deterministic layout for ZeRO).
  std::vector<std::string> param_order() const;
  // Parameters some op reads as f32 values; the others (linear weights) are read only as the 16-bit copy a
  // 16-bit GPU run keeps of them (Op::reads_param16_only).
  std::set<std::string> params_read_f32() const;
  // Index of the first / one-past-last node of each block.
  std::vector<std::pair<size_t, size_t>> block_ranges() const;
  Shape input_shape(const InputSpec& in, const std::map<std::string, int64_t>& symbols) const;
};

struct ExecHooks {
  std::function<void(size_t block)> before_block_forward;
  std::function<void(size_t block)> after_block_forward;
  std::function<void(size_t block)> before_block_backward;
  std::function<void(size_t block)> after_block_backward;  // "block grads ready"
};

// Runs a graph over parameter tensors the caller owns.
class Executor {
 public:
  Executor(const Graph& g, std::map<std::string, Tensor> params, std::map<std::string, Tensor> grads);
  // Replace parameter / gradient tensors (ZeRO-3 swaps gathered views in).
  void set_param(const std::string& name, const Tensor& t) { params_[name] = t; }
  void set_grad(const std::string& name, const Tensor& t) {
    grads_[name] = t;
    fresh_.erase(name);  // a tensor handed in is accumulated into
  }
  // Every gradient tensor held now becomes fresh: the next backward overwrites rather than accumulates (the
  // first micro-batch of a step, instead of zeroing the buffer and reading those zeros back); one it never
  // writes (no gradient path) is zero-filled at its end.
  void mark_grads_fresh();
  // 16-bit copies of parameters (see NodeCtx::params16); the caller keeps them equal to the rounded params.
  void set_params16(std::map<std::string, Tensor> p16) { params16_ = std::move(p16); }
  // Whether any node reads parameter `name` as f32 values (false: only through its 16-bit copy).
  bool reads_f32(const std::string& name) const;
  // Whether a node output is asked for in 16-bit storage (where the backend has it: CUDA 16-bit runs):
  // its producer emits16 and every consumer takes16. Throws for a name that is no node's output.
  bool stores16(const std::string& value) const;
  // The GELU fusions this graph allows (used where the backend fuses_gelu, unless ZERORUN_FUSE=0): GELU
  // nodes computed in their producing linear's forward, and those whose backward the consuming linear's input
  // gradient does (both with 16-bit values inside one block).
  int gelu_forward_fusions() const;
  int gelu_backward_fusions() const;
  // Residual adds folded into the linear producing one of their inputs (used where the backend fuses_residual).
  int residual_fusions() const;
  // Input gradients the last backward took as their op's output gradient tensor (Op::grad_is_dout), uncopied.
  int shared_grads() const { return aliased_; }
  // Forward over named inputs; returns the loss.
  double forward(const std::map<std::string, Tensor>& inputs);
  // The same, returning the loss as the (device) scalar tensor: reading it is left to the caller, so a GPU run
  // need not wait for the forward before the backward is queued.
  Tensor forward_async(const std::map<std::string, Tensor>& inputs);
  // Backward from d(loss) = loss_grad; parameter grads are accumulated.
  void backward(float loss_grad);
  // Announces the next backward's loss_grad before the forward, so a loss op can compute its input's gradient in
  // the forward (fused cross-entropy); that backward must then pass the same value.
  void set_next_loss_grad(float g) {
    next_loss_grad_ = g;
    have_next_loss_grad_ = true;
  }
  // The dropout masks of the next forward and backward (DropoutCtx); the default is off.
  void set_dropout(const DropoutCtx& d) { dropout_ = d; }
  // Whether some node drops out with probability above 0 while on (its masks change every step).
  bool has_dropout() const;
  // Drops saved activations (after backward, or to abandon a forward).
  void release();
  ExecHooks hooks;
  // Activation checkpointing: blocks listed here keep only their inputs
  // during forward and recompute in backward.
  std::vector<bool> checkpoint_block;
  // Selective recomputation: nodes listed here drop their outputs (those read only inside their block) and what
  // they saved once their block's forward is done, and run their forward again when the block's backward starts.
  std::vector<bool> recompute_node;
  // Marks the nodes of `blocks` whose op's recompute_class() is in `classes` ("norms", "mlp_act", "attention");
  // returns how many. A GELU recomputed is no longer fused into its linear's forward (the same kernel both times).
  int set_recompute(const std::set<std::string>& classes, const std::vector<bool>& blocks);
  // Chunked head and loss: the loss (rows_independent) and the row-local nodes back to the linear feeding it (the
  // head; softcap between) run over chunks of rows, so only a chunk's logits [rows, V] exist at a time: forward:
  // logits, loss of each chunk; backward: each chunk's logits again, the loss's gradient, d(hidden) rows and the
  // head weight's gradient. Costs one more head product; used where the batch has more rows than a chunk.
  // Rows per chunk: loss_chunk_rows, else as many as keep a chunk's logits within loss_chunk_bytes; 0 and 0: off.
  int64_t loss_chunk_bytes = int64_t{256} << 20;
  int64_t loss_chunk_rows = 0;
  int64_t loss_chunk_min_vocab = 0;  // loss_chunk_bytes applies only to heads of at least this many outputs
  bool loss_chunk_planned() const { return !loss_chain_.empty(); }
  int64_t last_loss_chunks() const { return loss_chunks_; }  // chunks the last forward ran (0: not chunked)

 private:
  void run_node_forward(size_t i);
  void plan_loss_chunks();
  int64_t chunk_rows(int64_t N) const;  // rows per chunk of the loss chain at N rows; 0: not chunked
  void chunked_loss(bool backward);     // the chain over its chunks (backward: with the gradients)
  void fill_params(size_t node, NodeCtx& c, bool with16) const;
  void fill_param_grads(size_t node, NodeCtx& c);  // dparams, handling fresh gradients
  std::vector<bool> grad_aliases(size_t node, const std::vector<Tensor>& dout) const;
  static bool is16(const Tensor& t) { return t.defined() && t.dtype() != DType::F32 && t.dtype() != DType::I32; }
  const Graph& g_;
  std::map<std::string, Tensor> params_, grads_, params16_;
  std::set<std::string> params_f32_;  // g_.params_read_f32()
  std::set<std::string> fresh_;       // gradients holding no values yet (mark_grads_fresh)
  std::map<std::string, size_t> value_id_;
  std::vector<std::vector<size_t>> node_in_, node_out_;
  std::vector<Tensor> values_, value_grads_;
  std::vector<std::vector<Tensor>> saved_;
  std::vector<const Op*> ops_;
  std::vector<std::pair<size_t, size_t>> block_ranges_;
  std::vector<size_t> node_block_;
  std::vector<int> last_use_;  // node index of a value's last forward consumer
  // Per value: its (node, input) uses and its producer (node, output), node -1 for graph inputs.
  std::vector<std::vector<std::pair<size_t, size_t>>> uses_;
  std::vector<std::pair<int, size_t>> producer_;
  // The fusion plan (src/graph/fusion_plan.h), made once in the constructor: per node output, kept in 16 bits.
  std::vector<std::vector<bool>> out16_;
  // Per node: the GELU node a linear computes in its forward (fwd) / whose backward its input gradient does
  // (bwd), or -1; per GELU node: whether this forward already produced its output.
  std::vector<int> gelu_fwd_, gelu_bwd_;
  // Per linear: the add node it folds in (or -1) and the add's other input, the residual.
  std::vector<int> res_add_;
  std::vector<size_t> res_value_;
  std::vector<bool> done_;          // per node: a fused producer already made its output in this forward
  std::vector<size_t> loss_chain_;  // head linear first, loss last; empty: no chunked loss possible
  int64_t loss_chunks_ = 0;
  bool fuse_ = true;
  DropoutCtx dropout_;
  int aliased_ = 0;
  bool have_next_loss_grad_ = false, have_loss_grad_ = false;
  float next_loss_grad_ = 0.f, loss_grad_ = 0.f;
  Tensor loss_grad_t_;  // the announced d(loss) on the device, made by the loss node's forward
  size_t loss_id_ = 0;
  bool have_forward_ = false;
};

}  // namespace zerorun
