// model.bin: round trip, builders, and rejection of corrupt or inconsistent files.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/common/tiny.h"
#include "zerorun/fsutil.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"

using namespace zerorun;
namespace fs = std::filesystem;

namespace {
std::string tmp(const std::string& name) {
  fs::path d = fs::temp_directory_path() / "zerorun_test_model";
  fs::create_directories(d);
  return (d / name).string();
}
Gpt2Spec tiny_gpt() { return testing::tiny_gpt_spec(); }
// Rewrites the header of a safetensors file, keeping the data bytes.
void rewrite_header(const std::string& src, const std::string& dst, const std::function<void(json&)>& edit) {
  std::string s = read_file(src);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | static_cast<unsigned char>(s[i]);
  json h = json::parse(s.substr(8, hl));
  edit(h);
  std::string nh = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((nh.size() >> (8 * i)) & 0xff);
  out += nh + s.substr(8 + hl);
  write_file_atomic(dst, out);
}
}  // namespace

TEST_CASE("gpt2 builder: init statistics, tying and blocks", "[model]") {
  Model m = build_gpt2(tiny_gpt(), 3);
  REQUIRE(m.graph.blocks == std::vector<std::string>{"embed", "h.0", "h.1", "head"});
  REQUIRE(m.tensors.count("lm_head.weight") == 0);  // tied to wte
  int uses = 0;
  for (auto& n : m.graph.nodes)
    for (auto& [r, name] : n.params) uses += name == "wte.weight";
  REQUIRE(uses == 2);
  auto stdev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += t.f32()[i], s2 += t.f32()[i] * t.f32()[i];
    double m = s / t.numel();
    return std::sqrt(s2 / t.numel() - m * m);
  };
  REQUIRE(stdev(m.tensors.at("wte.weight")) == Approx(0.02).epsilon(0.05));
  REQUIRE(stdev(m.tensors.at("h.0.mlp.c_fc.weight")) == Approx(0.02).epsilon(0.05));
  REQUIRE(stdev(m.tensors.at("h.0.attn.c_proj.weight")) == Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
  REQUIRE(m.tensors.at("h.1.ln_2.weight").f32()[5] == 1.f);
  REQUIRE(m.tensors.at("h.1.attn.c_attn.bias").f32()[0] == 0.f);
}

TEST_CASE("model.bin round trip is exact and is valid safetensors", "[model]") {
  Model m = build_gpt2(tiny_gpt(), 5);
  std::string p = tmp("rt.bin");
  save_model(p, m);
  Model r = load_model(p);
  REQUIRE(r.graph_hash == m.graph_hash);
  REQUIRE(r.tensor_names == m.tensor_names);
  for (auto& [k, t] : m.tensors) REQUIRE(std::memcmp(t.raw(), r.tensors.at(k).raw(), t.nbytes()) == 0);
  SafetensorsFile f = read_safetensors_header(p);
  REQUIRE(f.metadata.at("format") == "zerorun.model");
  REQUIRE(f.data_start % 8 == 0);
  Model mlp = build_mlp(MlpSpec{}, 1);
  REQUIRE(mlp.num_params() == 512 * 1024 + 1024 + 1024 * 512 + 512);
  Model llama = build_llama(LlamaSpec{64, 16, 32, 2, 4, 48}, 1);
  save_model(tmp("llama.bin"), llama);
  REQUIRE(load_model(tmp("llama.bin")).num_params() == llama.num_params());
}

TEST_CASE("corrupt model.bin files are rejected naming the file and fault", "[model]") {
  Model m = build_gpt2(tiny_gpt(), 5);
  std::string good = tmp("good.bin");
  save_model(good, m);
  std::string s = read_file(good);
  std::string bad = tmp("bad.bin");

  write_file_atomic(bad, s.substr(0, s.size() - 100));
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains(bad) && Catch::Contains("out of range"));

  write_file_atomic(bad, s.substr(0, 5));
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("too short"));

  std::string big = s;
  big[7] = 0x7f;  // absurd header length
  write_file_atomic(bad, big);
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("header length"));

  std::string garbage = s;
  garbage[8] = '#';
  write_file_atomic(bad, garbage);
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("not valid JSON"));

  rewrite_header(good, bad, [](json& h) {
    h["wpe.weight"]["data_offsets"] = h["wte.weight"]["data_offsets"];
    h["wpe.weight"]["shape"] = h["wte.weight"]["shape"];
  });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("overlap"));

  rewrite_header(good, bad, [](json& h) { h["wpe.weight"]["shape"] = {3, 3}; });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("needs 36 bytes"));

  rewrite_header(good, bad, [](json& h) { h["__metadata__"]["format"] = "pt"; });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("not a zerorun model"));

  rewrite_header(good, bad, [](json& h) {
    json g = json::parse(h["__metadata__"]["graph"].get<std::string>());
    g["nodes"][0]["params"]["weight"] = "missing.weight";
    h["__metadata__"]["graph"] = g.dump();
  });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains(bad) && Catch::Contains("'missing.weight'"));

  rewrite_header(good, bad, [](json& h) {
    json g = json::parse(h["__metadata__"]["graph"].get<std::string>());
    g["nodes"][4]["in"] = {"nonexistent"};
    h["__metadata__"]["graph"] = g.dump();
  });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("'nonexistent' is not produced"));

  // A tensor whose shape does not fit the graph (c_attn weight transposed).
  rewrite_header(good, bad, [](json& h) { h["h.0.attn.c_attn.weight"]["shape"] = {32, 96}; });
  REQUIRE_THROWS_WITH(load_model(bad), Catch::Contains("h.0") && Catch::Contains("does not match weight"));

  REQUIRE_THROWS_WITH(load_model(tmp("does_not_exist.bin")), Catch::Contains("cannot open"));

  // A Llama whose SwiGLU multiplies the gate by the residual stream (another width): the node and both shapes.
  std::string lgood = tmp("llama.bin");
  save_model(lgood, build_llama(testing::tiny_llama_spec(64, 16, 32, 1, 2, 48), 3));
  rewrite_header(lgood, bad, [](json& h) {
    json g = json::parse(h["__metadata__"]["graph"].get<std::string>());
    for (auto& n : g["nodes"])
      if (n["op"] == "swiglu") n["in"][1] = "x.0";
    h["__metadata__"]["graph"] = g.dump();
  });
  REQUIRE_THROWS_WITH(
      load_model(bad),
      Catch::Contains(bad) && Catch::Contains("(swiglu in block 'layers.0')") &&
          Catch::Contains("swiglu needs equal shapes for gate and up, got [1, 16, 48] and [1, 16, 32]"));
}

TEST_CASE("training FLOPs per token: 6 per parameter, plus 6·L·C·T attention for gpt2 and llama", "[model]") {
  Gpt2Spec g;
  g.vocab = 96, g.n_ctx = 32, g.n_embd = 48, g.n_layer = 3, g.n_head = 4;
  Model m = build_gpt2(g, 1);
  const double P = static_cast<double>(m.num_params());
  CHECK(train_flops_per_token(m, 32) == 6 * P + 6.0 * 3 * 48 * 32);
  CHECK(train_flops_per_token(m, 16) == 6 * P + 6.0 * 3 * 48 * 16);
  LlamaSpec l;
  l.vocab = 96, l.n_ctx = 32, l.n_embd = 64, l.n_layer = 2, l.n_head = 4, l.ffn = 96;
  Model ml = build_llama(l, 1);
  CHECK(train_flops_per_token(ml, 32) == 6.0 * static_cast<double>(ml.num_params()) + 6.0 * 2 * 64 * 32);
  Model mlp = build_mlp(MlpSpec{}, 1);
  CHECK(train_flops_per_token(mlp, 1) == 6.0 * static_cast<double>(mlp.num_params()));
}

TEST_CASE("model.bin in bf16 / f16: stored rounded, opened lazily, read by range as load_model reads it", "[model]") {
  Model m = build_gpt2(tiny_gpt(), 7);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    m.dtype = dt;
    const std::string p = tmp(std::string("dt_") + dtype_name(dt) + ".bin");
    save_model(p, m);
    SafetensorsFile f = read_safetensors_header(p);
    for (auto& e : f.entries) REQUIRE(e.dtype == dt);
    Model full = load_model(p);
    Model lazy = open_model(p);
    REQUIRE(lazy.tensors.empty());
    REQUIRE(lazy.dtype == dt);
    REQUIRE(lazy.graph_hash == m.graph_hash);
    REQUIRE(lazy.tensor_names == m.tensor_names);
    REQUIRE(lazy.num_params() == m.num_params());
    for (auto& [k, t] : m.tensors) {
      const Tensor& got = full.tensors.at(k);
      for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(got.f32()[i] == round_to(dt, t.f32()[i]));
      // Odd ranges (the widening runs in place inside dst) give the same values as the whole load.
      const int64_t n = t.numel(), first = n / 3, count = n - n / 3 - 1;
      std::vector<float> part(static_cast<size_t>(count) + 1, -7.f);
      lazy.read_f32(k, first, count, part.data());
      for (int64_t i = 0; i < count; ++i) REQUIRE(part[static_cast<size_t>(i)] == got.f32()[first + i]);
      REQUIRE(part.back() == -7.f);  // nothing past the range is written
    }
    // An opened model saves again (tensor by tensor), here to another dtype.
    lazy.dtype = DType::F32;
    save_model(tmp("resaved.bin"), lazy);
    Model back = load_model(tmp("resaved.bin"));
    for (auto& [k, t] : full.tensors) REQUIRE(std::memcmp(t.raw(), back.tensors.at(k).raw(), t.nbytes()) == 0);
  }
  // f16 cannot hold 1e5: an error naming the tensor, and nothing written.
  m.dtype = DType::F16;
  m.tensors.at("h.0.ln_1.bias").f32()[2] = 1e5f;
  const std::string p = tmp("too_big_f16.bin");
  std::remove(p.c_str());
  REQUIRE_THROWS_WITH(save_model(p, m), Catch::Contains("'h.0.ln_1.bias' element 2") && Catch::Contains("f16"));
  REQUIRE(!fs::exists(p));
}

TEST_CASE("an opened model.bin reports a NaN where a range read meets it", "[model]") {
  Model m = build_gpt2(tiny_gpt(), 8);
  m.tensors.at("h.1.mlp.c_fc.weight").f32()[100] = std::nanf("");
  const std::string p = tmp("nan_lazy.bin");
  std::vector<SafetensorsWriteItem> items;  // save_model refuses NaN: the raw container
  for (auto& n : m.tensor_names) items.push_back({n, m.tensors.at(n)});
  write_safetensors(p, items, {{"format", "zerorun.model"}, {"version", "1"}, {"graph", m.graph.to_json().dump()}});
  Model lazy = open_model(p);  // the header only: no error yet
  std::vector<float> buf(200);
  lazy.read_f32("h.1.mlp.c_fc.weight", 0, 100, buf.data());  // before the NaN
  REQUIRE_THROWS_WITH(lazy.read_f32("h.1.mlp.c_fc.weight", 50, 100, buf.data()),
                      Catch::Contains(p) && Catch::Contains("'h.1.mlp.c_fc.weight'") && Catch::Contains("element 100"));
  REQUIRE_THROWS_WITH(lazy.read_f32("h.1.mlp.c_fc.weight", 0, 1 << 30, buf.data()), Catch::Contains("of parameter"));
}

TEST_CASE("builders with shapes_only: the same graph and shapes, no weights", "[model]") {
  LlamaSpec s{64, 16, 32, 2, 4, 48};
  Model full = build_llama(s, 1), shapes = build_llama(s, 1, true);
  REQUIRE(shapes.tensors.empty());
  REQUIRE(shapes.graph_hash == full.graph_hash);
  REQUIRE(shapes.param_shapes() == full.param_shapes());
  REQUIRE(shapes.num_params() == full.num_params());
  REQUIRE(build_gpt2(tiny_gpt(), 1, true).num_params() == build_gpt2(tiny_gpt(), 1).num_params());
}
