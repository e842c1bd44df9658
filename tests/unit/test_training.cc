// Single-rank training: loss falls, gradient accumulation is equivalent to a
// bigger micro batch, activation checkpointing changes nothing, fp16
// overflow skips the step.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "tests/common/tiny.h"
#include "zerorun/engine.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"
#include "zerorun/rng.h"
#include "zerorun/zero_plan.h"

using namespace zerorun;
using testing::make_cfg;
using testing::tiny_gpt;
using testing::train_losses;

TEST_CASE("tiny GPT-2 and MLP losses fall", "[train]") {
  Model g = tiny_gpt();
  auto lg = train_losses(
      g, make_cfg(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})"), 40);
  REQUIRE(lg.back() < 0.6 * lg.front());
  MlpSpec ms;
  ms.in = 32;
  ms.hidden = 64;
  ms.out = 32;
  Model mlp = build_mlp(ms, 3);
  auto lm = train_losses(
      mlp, make_cfg(R"({"train_batch_size": 16, "optimizer": {"type": "Adam", "params": {"lr": 3e-3}}})"), 60);
  REQUIRE(lm.back() < 0.5 * lm.front());
  auto ls = train_losses(
      mlp,
      make_cfg(R"({"train_batch_size": 16, "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}}})"),
      60);
  REQUIRE(ls.back() < 0.7 * ls.front());
}

TEST_CASE("gradient accumulation equals a larger micro batch", "[train]") {
  Model g = tiny_gpt();
  std::map<std::string, Tensor> w1, w2;
  auto a = train_losses(
      g, make_cfg(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.5})"), 6, &w1);
  auto b = train_losses(
      g, make_cfg(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5})"), 6, &w2);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == Approx(a[i]).epsilon(1e-5));
  for (auto& [k, t] : w1)
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(w2[k].f32()[i] == Approx(t.f32()[i]).margin(1e-5));
}

TEST_CASE("activation checkpointing is bitwise identical", "[train]") {
  LlamaSpec ls = testing::tiny_llama_spec(64, 16, 32, 2, 4, 48);
  ls.n_kv_head = 2;  // grouped-query, rotary, tied: the rope's recompute too
  ls.tied = true;
  for (const Model& g : {tiny_gpt(), build_llama(ls, 5)}) {
    INFO(g.graph.meta.value("arch", std::string()));
    std::map<std::string, Tensor> w1, w2;
    auto a = train_losses(g, make_cfg(R"({"train_batch_size": 4})"), 4, &w1);
    auto b = train_losses(
        g, make_cfg(R"({"train_batch_size": 4, "activation_checkpointing": {"partition_activations": false}})"), 4,
        &w2);
    REQUIRE(a == b);
    REQUIRE(a.back() < a.front());
    for (auto& [k, t] : w1) REQUIRE(std::memcmp(t.raw(), w2[k].raw(), t.nbytes()) == 0);
  }
}

namespace {
using Tensors = std::map<std::string, Tensor>;
Tensors zero_grads(const Tensors& weights) {
  Tensors g;
  for (auto& [k, t] : weights) g[k] = Tensor::zeros(t.shape(), DType::F32);
  return g;
}
// One forward and backward of `g` on the CPU with the executor's fusions on, then off (ZERORUN_FUSE=0): the loss
// and every parameter gradient must be bitwise equal. `seen(executor, fused)` looks at each after its backward.
void fusions_change_nothing(const Graph& g, const Tensors& weights, const Tensors& inputs,
                            const std::function<void(const Executor&, bool)>& seen) {
  auto run = [&](bool fused) {
    if (!fused) platform::set_env("ZERORUN_FUSE", "0"), reload_knobs();
    Tensors gr = zero_grads(weights);
    Executor ex(g, weights, gr);
    if (!fused) platform::unset_env("ZERORUN_FUSE"), reload_knobs();  // read by the constructor
    const double loss = ex.forward(inputs);
    ex.backward(1.f);
    seen(ex, fused);
    gr["loss"] = Tensor::empty({1}, DType::F32);
    gr["loss"].f32()[0] = static_cast<float>(loss);
    return gr;
  };
  Tensors a = run(true), b = run(false);
  for (auto& [k, t] : a) {
    INFO(k);
    REQUIRE(std::memcmp(t.raw(), b[k].raw(), t.nbytes()) == 0);
  }
}
}  // namespace

TEST_CASE(
    "residual adds fold into the projections' products and hand their output gradient to both inputs "
    "uncopied; loss and gradients are bitwise unchanged",
    "[train]") {
  Model g = tiny_gpt();
  Tensor tok = Tensor::empty({2, 16}, DType::I32), tgt = Tensor::empty({2, 16}, DType::I32);
  for (int64_t i = 0; i < 32; ++i) tok.i32()[i] = static_cast<int32_t>((i * 7 + 1) % 64);
  for (int64_t i = 0; i < 32; ++i) tgt.i32()[i] = static_cast<int32_t>((i * 5 + 2) % 64);
  int on = -1, off = -1;
  fusions_change_nothing(g.graph, g.tensors, {{"tokens", tok}, {"targets", tgt}},
                         [&](const Executor& ex, bool fused) { (fused ? on : off) = ex.shared_grads(); });
  CHECK(on == (2 * 2 + 1) * 2);  // two blocks of two residual adds, and token + position embeddings: both inputs
  CHECK(off == 0);
}

TEST_CASE("residual folding only where the linear's output has one use, the residual is ready, and shapes match",
          "[train]") {
  Graph g;
  g.inputs = {{"x", DType::F32, {"B", "8"}}, {"y", DType::F32, {"B", "8"}}, {"bvec", DType::F32, {"8"}}};
  g.blocks = {"b"};
  auto node = [&](const char* op, std::vector<std::string> in, const char* out, const char* w = nullptr) {
    Node n;
    n.op = op;
    n.block = "b";
    n.in = std::move(in);
    n.out = {out};
    if (w) n.params["weight"] = w;
    g.nodes.push_back(n);
  };
  node("linear", {"x"}, "a", "w1");
  node("linear", {"x"}, "c", "w2");
  node("add", {"a", "c"}, "s1");  // folds into c's linear (a is made before it)
  node("linear", {"s1"}, "d", "w3");
  node("add", {"s1", "d"}, "s2");  // d has two uses: not folded
  node("linear", {"d"}, "e", "w4");
  node("add", {"e", "bvec"}, "s3");  // planned into e's linear, but bvec broadcasts: the add runs
  node("add", {"s2", "s3"}, "f");
  node("mse", {"f", "y"}, "loss");
  g.loss = "loss";
  std::map<std::string, Shape> shapes = {{"w1", {8, 8}}, {"w2", {8, 8}}, {"w3", {8, 8}}, {"w4", {8, 8}}};
  g.validate(shapes, {{"B", 3}});
  Rng r(5);
  std::map<std::string, Tensor> w;
  for (auto& [k, sh] : shapes) {
    w[k] = Tensor::empty(sh, DType::F32);
    for (int64_t i = 0; i < w[k].numel(); ++i) w[k].f32()[i] = static_cast<float>(r.uniform() - 0.5);
  }
  std::map<std::string, Tensor> in;
  for (auto [k, n] : {std::pair<const char*, int64_t>{"x", 24}, {"y", 24}, {"bvec", 8}}) {
    in[k] = Tensor::empty(n == 8 ? Shape{8} : Shape{3, 8}, DType::F32);
    for (int64_t i = 0; i < n; ++i) in[k].f32()[i] = static_cast<float>(r.uniform() - 0.5);
  }
  int on = -1, off = -1;
  fusions_change_nothing(g, w, in, [&](const Executor& ex, bool fused) { (fused ? on : off) = ex.residual_fusions(); });
  CHECK(on == 2);
  CHECK(off == 2);  // the plan is the graph's; ZERORUN_FUSE=0 only stops its use
}

TEST_CASE(
    "fresh gradients: the step's first backward overwrites whatever the buffers held (tied weight, "
    "a parameter without a gradient path, accumulation after it), equal to zero-fill and accumulate",
    "[train]") {
  Model g = tiny_gpt();  // wte.weight: token embedding and the tied lm head (two nodes, one written first)
  Tensor tok = Tensor::empty({2, 16}, DType::I32), tgt = Tensor::empty({2, 16}, DType::I32);
  for (int64_t i = 0; i < 32; ++i) tok.i32()[i] = static_cast<int32_t>((i * 7 + 1) % 64);
  for (int64_t i = 0; i < 32; ++i) tgt.i32()[i] = static_cast<int32_t>((i * 5 + 2) % 64);
  const Tensors in = {{"tokens", tok}, {"targets", tgt}};
  auto run = [&](bool fresh, int passes) {
    Tensors gr = zero_grads(g.tensors);
    gr["unused"] = Tensor::zeros({3}, DType::F32);  // no node reads it: must read as zeros
    Executor ex(g.graph, g.tensors, gr);
    if (fresh) {
      for (auto& [k, t] : gr) std::fill_n(t.f32(), t.numel(), std::nanf(""));  // stale values: never read
      ex.mark_grads_fresh();
    }
    for (int p = 0; p < passes; ++p) {  // later passes accumulate (gradient accumulation's micro-batches)
      ex.forward(in);
      ex.backward(1.f);
    }
    return gr;
  };
  for (int passes : {1, 2}) {
    Tensors a = run(false, passes), b = run(true, passes);
    for (auto& [k, t] : a) {
      INFO(k << " after " << passes << " passes");
      REQUIRE(std::memcmp(t.raw(), b[k].raw(), t.nbytes()) == 0);
    }
    CHECK(b["unused"].f32()[0] == 0.f);
  }
}

TEST_CASE("a d(loss) announced before the forward must be the backward's", "[train]") {
  Model g = tiny_gpt();
  Tensors gr = zero_grads(g.tensors);
  Executor ex(g.graph, g.tensors, gr);
  Tensor tok = Tensor::zeros({2, 16}, DType::I32);
  ex.set_next_loss_grad(0.5f);
  ex.forward({{"tokens", tok}, {"targets", tok}});
  CHECK_THROWS_WITH(ex.backward(1.f), Catch::Contains("differs from the value announced"));
  ex.release();
  ex.set_next_loss_grad(0.5f);
  ex.forward({{"tokens", tok}, {"targets", tok}});
  CHECK_NOTHROW(ex.backward(0.5f));
  ex.forward({{"tokens", tok}, {"targets", tok}});  // an announcement holds for one forward only
  CHECK_NOTHROW(ex.backward(1.f));
}

TEST_CASE("fp16 overflow skips the step and halves the scale", "[train]") {
  Model g = tiny_gpt();
  Config c = make_cfg(
      R"({"train_batch_size": 4, "fp16": {"enabled": true, "initial_scale_power": 16, "hysteresis": 1, "min_loss_scale": 1}})");
  auto comm = make_self_comm();
  Engine e(g, c, *comm, 10);
  int inject = 1;  // steps whose gradients get an inf / nan
  e.after_backward = [&](float* grad, int64_t n) {
    if (inject > 0) grad[n / 2] = (inject % 2) ? INFINITY : NAN;
  };
  auto data = make_data_source("synthetic", g, e.seq_len(), 5);
  auto before = e.master_weights();
  StepStats s1 = e.train_step(*data);
  REQUIRE(s1.skipped);
  auto after = e.master_weights();
  for (auto& [k, t] : before) REQUIRE(std::memcmp(t.raw(), after[k].raw(), t.nbytes()) == 0);
  inject = 0;
  StepStats s2 = e.train_step(*data);
  REQUIRE(s2.loss_scale == s1.loss_scale / 2);
  REQUIRE(!s2.skipped);
  // Overflow at every step walks the scale down to min_loss_scale, then errors.
  inject = 2;
  int skipped = 0;
  std::string err;
  bool all_skipped = true;
  try {
    for (int i = 0; i < 100; ++i) {
      all_skipped = all_skipped && e.train_step(*data).skipped;
      ++skipped;
    }
  } catch (const Error& ex) {
    err = ex.what();
  }
  REQUIRE(all_skipped);
  REQUIRE_THAT(err, Catch::Contains("minimum"));
  REQUIRE(skipped == 15);  // 2^15 .. 2^1 skipped, then at 2^0 = min it stops
}

TEST_CASE("bf16 mode trains with rounded compute weights", "[train]") {
  Model g = tiny_gpt();
  auto l = train_losses(
      g,
      make_cfg(
          R"({"train_batch_size": 8, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})"),
      30);
  auto f = train_losses(
      g, make_cfg(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})"), 30);
  REQUIRE(l.back() < 0.7 * l.front());
  REQUIRE(l[0] != f[0]);  // rounding is really applied
  REQUIRE(l[0] == Approx(f[0]).epsilon(1e-2));
}

TEST_CASE("zerorun estimate's model-state bytes are what the engine allocates", "[train]") {
  Model g = tiny_gpt();
  const double P = static_cast<double>(g.num_params());
  for (const char* prec : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int st = 0; st <= 3; ++st) {
      INFO("stage " << st << (*prec ? " bf16" : " fp32"));
      Config c = make_cfg(R"({"train_batch_size": 4, "zero_optimization": {"stage": )" + std::to_string(st) +
                          R"(, "stage3_param_persistence_threshold": 0})" + prec + "}");
      auto comm = make_self_comm();
      Engine e(g, c, *comm, 1);
      const ModelStateBytes b = e.model_state_bytes();
      const zero::StateEstimate est = zero::estimate_model_states(P, st, 1, *prec != 0, false, false, false);
      // Padding to the alignment adds a little to the engine's buffers.
      auto near = [](double got, double want) { return got >= want && got <= want * 1.02 + 4096; };
      CHECK(near(b.params, est.params));
      CHECK(near(b.grads, est.grads));
      CHECK(near(b.optimizer, est.optimizer));
      CHECK(est.host == Approx(est.params + est.grads + est.optimizer));
    }
  }
  // World size and offload arithmetic (GPU runs): stage-2 bf16 on 4 ranks with the optimizer on the host.
  const zero::StateEstimate o = zero::estimate_model_states(1000, 2, 4, true, true, true, false);
  CHECK(o.params == 6000);            // f32 + 16-bit compute weights
  CHECK(o.grads == 1000 + 1000);      // the gradient shard, and its host copy
  CHECK(o.optimizer == 1000 + 2000);  // master and moments shards
  CHECK(o.device == 6000 + 1000);     // params + gradient shard
  CHECK(o.host == 1000 + 3000);       // host gradient shard + optimizer
  // 16-bit GPU runs with the master on the device keep f32 values only for f32_read (stages 1-2 on several ranks
  // all-gather the 16-bit copy); offload keeps the full f32 copy.
  CHECK(zero::estimate_model_states(1000, 0, 4, true, true, false, false, 300).params == 1200 + 2000);
  CHECK(zero::estimate_model_states(1000, 2, 1, true, true, false, false, 300).params == 1200 + 2000);
  CHECK(zero::estimate_model_states(1000, 1, 4, true, true, false, false, 300).params == 1200 + 2000);
  CHECK(zero::estimate_model_states(1000, 2, 4, true, true, false, false, 300).params == 1200 + 2000);
  CHECK(zero::estimate_model_states(1000, 2, 4, true, true, true, false, 300).params == 4000 + 2000);
  CHECK(zero::estimate_model_states(1000, 0, 1, false, true, false, false, 300).params == 4000);  // fp32
  // Of the tiny GPT, the linear weights are read in 16 bits only.
  double f32_read = 0;
  for (const std::string& p : g.graph.params_read_f32()) {
    CHECK((g.tensors.at(p).ndim() != 2 || p == "wte.weight" || p == "wpe.weight"));
    f32_read += static_cast<double>(g.tensors.at(p).numel());
  }
  CHECK(f32_read > 0);
  CHECK(f32_read < P / 2);
  CHECK_THROWS_WITH(zero::estimate_model_states(1, 4, 1, false, false, false, false), Catch::Contains("stage"));
}

TEST_CASE("a step's host bytes by category are the engine's model states; the memory line shows them", "[train]") {
  Model g = tiny_gpt();
  for (int st = 0; st <= 3; ++st) {
    for (const char* prec : {"", R"(, "bf16": {"enabled": true})"}) {
      INFO("stage " << st << (*prec ? " bf16" : " fp32"));
      Config c = make_cfg(R"({"train_batch_size": 4, "zero_optimization": {"stage": )" + std::to_string(st) +
                          R"(, "stage3_param_persistence_threshold": 300, "reduce_bucket_size": 2000})" + prec + "}");
      auto comm = make_self_comm();
      Engine e(g, c, *comm, 2);
      auto data = make_data_source("synthetic", g, e.seq_len(), 5);
      for (int k = 0; k < 2; ++k) {
        const StepStats s = e.train_step(*data);
        const ModelStateBytes b = e.model_state_bytes();
        auto host = [&](MemCategory m) { return s.memory.host[static_cast<size_t>(m)]; };
        CHECK(host(MemCategory::Params) == b.params);
        CHECK(host(MemCategory::Grads) == b.grads);
        CHECK(host(MemCategory::Optimizer) == b.optimizer);
        CHECK(b.optimizer > 0);
        CHECK(s.memory.nvme_total() == 0);
        CHECK(s.memory.device == MemoryNow::ByCategory{});  // a CPU run
        CHECK(s.memory.pinned == 0);
        CHECK(s.transfer_wait_seconds == 0);
      }
      const std::string rep = e.memory_report();
      CHECK(rep.find("| host now: params=") != std::string::npos);
      CHECK(rep.find("activations=") != std::string::npos);
      CHECK(rep.find("device now:") == std::string::npos);
      CHECK(rep.find("NVMe now:") == std::string::npos);
    }
  }
}

TEST_CASE(
    "16-bit storage plan: what feeds only 16-bit readers is stored in 16 bits, the residual stream is not; "
    "GELU fuses into the linears on both sides",
    "[train]") {
  Model g = tiny_gpt();
  std::map<std::string, Tensor> none;
  Executor ex(g.graph, none, none);
  for (const char* v : {"h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.out", "h.0.ln_2", "h.0.mlp.c_fc", "h.0.mlp.gelu",
                        "h.1.attn.out", "ln_f", "logits"})
    CHECK(ex.stores16(v));
  // Outputs read by the residual adds or a loss stay f32; so do the embeddings.
  for (const char* v : {"h.0.attn.c_proj", "h.0.mlp.c_proj", "h.0.res1", "h.0.res2", "h.1.res2", "loss"})
    CHECK_FALSE(ex.stores16(v));
  CHECK_THROWS_WITH(ex.stores16("tokens"), Catch::Contains("not a node output"));
  CHECK_THROWS_WITH(ex.stores16("nope"), Catch::Contains("not a node output"));
  Model l = build_llama(testing::tiny_llama_spec(64, 16, 32, 1, 2, 48), 3);
  Executor el(l.graph, none, none);
  CHECK(el.stores16("layers.0.self_attn.qkv_proj"));  // read only by rope
  CHECK(el.stores16("layers.0.self_attn.rope"));      // read only by attention
  CHECK(el.stores16("layers.0.self_attn.out"));
  // The norms feed only products, gate and up only the SwiGLU, whose output only the down product.
  for (const char* v : {"layers.0.input_layernorm", "layers.0.post_attention_layernorm", "norm",
                        "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj", "layers.0.mlp.gated", "lm_head"})
    CHECK(el.stores16(v));
  for (const char* v : {"layers.0.self_attn.o_proj", "layers.0.mlp.down_proj", "layers.0.res1", "layers.0.res2"})
    CHECK_FALSE(el.stores16(v));
  // GELU fusions: every block's c_fc -> gelu -> c_proj (two blocks); Llama has no GELU.
  CHECK(ex.gelu_forward_fusions() == 2);
  CHECK(ex.gelu_backward_fusions() == 2);
  CHECK(el.gelu_forward_fusions() == 0);
  CHECK(el.gelu_backward_fusions() == 0);
  // Residual adds folded into the projection before them: attention's and the MLP's in every block (Llama too).
  CHECK(ex.residual_fusions() == 4);
  CHECK(el.residual_fusions() == 2);
}

TEST_CASE("fusion plan: driven by what ops declare (Op::epilogue, Op::residual_add), not by their names", "[train]") {
  for (const std::string& name : op_names()) {  // the declarations as they stand: gelu and add
    CHECK((op_lookup(name).epilogue() == Epilogue::GeluTanh) == (name == "gelu"));
    CHECK(op_lookup(name).residual_add() == (name == "add"));
  }
  // The same GPT with relu (no epilogue) for GELU and mul (no residual add) for the adds: nothing is fused.
  Model g = tiny_gpt();
  Graph other = g.graph;
  int swapped = 0;
  for (Node& n : other.nodes)
    if (n.op == "gelu" || n.op == "add") {
      n.op = n.op == "gelu" ? "relu" : "mul";
      ++swapped;
    }
  CHECK(swapped == 7);  // 2 GELUs, 4 residual adds and the embeddings' add
  std::map<std::string, Tensor> none;
  Executor ex(g.graph, none, none), eo(other, none, none);
  CHECK(ex.gelu_forward_fusions() == 2);
  CHECK(ex.residual_fusions() == 4);
  CHECK(eo.gelu_forward_fusions() == 0);
  CHECK(eo.gelu_backward_fusions() == 0);
  CHECK(eo.residual_fusions() == 0);
}

TEST_CASE("eval loss: the first batch's eval equals step 1's loss; evaluating never changes training", "[train]") {
  for (const char* z : {R"({"stage": 0})", R"({"stage": 3, "stage3_param_persistence_threshold": 0})"}) {
    INFO(z);
    auto r = testing::eval_between_steps(
        tiny_gpt(), make_cfg(std::string(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                                            "zero_optimization": )") +
                             z + "}"));
    REQUIRE(r.eval0 == r.step1);      // before any update eval sees what step 1 trains on, with the same weights
    REQUIRE(r.with_eval == r.plain);  // bitwise: eval touches no gradient, weight or optimizer state
    REQUIRE(r.same_weights);
  }
}

TEST_CASE("resuming with another train_batch_size goes on at the next unread sample", "[train][checkpoint]") {
  // A data source that records the first sample of every micro-batch it serves.
  struct Recording : DataSource {
    std::unique_ptr<DataSource> inner;
    std::vector<int64_t> firsts;
    std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
      firsts.push_back(first);
      return inner->batch(first, count);
    }
    std::string describe() const override { return inner->describe(); }
    int64_t tokens_per_sample() const override { return inner->tokens_per_sample(); }
  };
  Model g = tiny_gpt();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zr_resume_batch_" + std::to_string(platform::process_id()))).string();
  auto comm = make_self_comm();
  Recording d;
  {
    Engine a(g, make_cfg(R"({"train_batch_size": 4})"), *comm, 5);
    d.inner = make_data_source("synthetic", g, a.seq_len(), 5);
    a.train_step(d), a.train_step(d);  // samples 0..7
    a.save_checkpoint(dir);
  }
  Engine b(g, make_cfg(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4})"), *comm, 5);
  b.load_checkpoint(dir);
  REQUIRE(b.samples_seen() == 8);
  d.firsts.clear();
  b.train_step(d);
  REQUIRE(d.firsts == std::vector<int64_t>{8, 12});  // not 16 (step 2 x the new batch of 8)
  REQUIRE(b.samples_seen() == 16);
  std::filesystem::remove_all(dir);
}
